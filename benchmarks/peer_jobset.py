"""The operator against JobSet, side by side on one 1,024-node cluster, in one run.

The peer: JobSet (sigs.k8s.io/jobset, the version pinned in tests/cluster/versions.env), which
Kubeflow Trainer v2 runs its TrainJobs on, with its webhooks, next to `mjob operator`, on the same
local control plane (`tests/cluster/cluster up --nodes 1024 --jobset`: kube-apiserver, etcd,
scheduler, controller-manager and kwok on this machine's cores).

The same gang on both sides: 1,024 pods, one per node (required pod anti-affinity on the
hostname), 8 GPUs each (the whole cluster), rack affinity as a preferred pod affinity on the rack
label (what both can express; a MegatronJob says `topology: {key: <rack label>, mode:
preferred}`). The JobSet's pod template is the operator's own rendered pod (image, command, env,
resources, volumes, grace period), with JobSet's label in the affinity selectors. The JobSet is
what Trainer v2 makes: one replicated Job of 1,024 indexed pods, `backoffLimit: 0`, and a
`failurePolicy` that recreates the gang (JobSet's restart).

Figures, each measured on both sides, alternating the order every round so that a drift in load
hits both:
  - create: apply → all 1,024 pods created, and → all Running;
  - recreate: one pod failed (kwok marks it Failed with exit code 1) → all 1,024 pods of the
    next attempt Running (our Recreate rung vs JobSet's failurePolicy restart);
  - the controller's CPU-seconds in that restart (the operator, or the JobSet controller; plus
    kube-controller-manager, whose Job controller creates JobSet's pods and whose garbage
    collector deletes both sides' old pods), and the apiserver's writes (mutating requests,
    without leases and nodes, which kwok renews in the background);
  - inplace: our InPlace rung, once it exists (no peer figure of JobSet's: its in-place restart
    needs a kubelet alpha feature of Kubernetes 1.35; the ratio is against JobSet's recreate).

Times come from the objects' timestamps (creationTimestamp; the Ready condition's
lastTransitionTime), which have 1 s resolution: figures are ±1 s. Polling asks for metadata only
(as the garbage collector does), filtered by phase on the server, so it costs the control plane
being measured little.

Run: flock /work/wt/heavy.lock python benchmarks/peer_jobset.py      (a fresh 1,024-node cluster)
     python benchmarks/peer_jobset.py --state DIR   (a running `cluster up --jobset` cluster)
     python benchmarks/peer_jobset.py --nodes 128   (a smaller cluster and gang, to try it out)
Prints a table, then one line per figure: `ratio <figure> ours/jobset = X`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "cluster" / "cluster"
RACK_KEY = "topology.megatron.dev/rack"
GPU = "nvidia.com/gpu"
NS_OURS, NS_JOBSET = "peer-ours", "peer-jobset"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
OUR_JOB_LABEL = "megatron.dev/job-name"
OUR_ATTEMPT = "megatron.dev/restart-attempt"
JOB_INDEX = "batch.kubernetes.io/job-completion-index"
SETTLE_SECONDS = 3.0  # after the last pod is Running: trailing status writes count too
GOALS = {"create_created": 0.67, "create_running": 0.67, "recreate": 0.5, "inplace": 0.2}
# Writes that are the simulation's background, not the restart's: kwok renews node leases.
BACKGROUND_RESOURCES = frozenset({"leases", "nodes"})


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Cluster:
    """The control plane under test: kubectl, metadata-only pod lists, metrics, process CPU."""

    def __init__(self, state: Path) -> None:
        self.state = state
        info = json.loads((state / "cluster.json").read_text())
        self.info = info
        self.kubectl_path = info["kubectl"]
        self.kubeconfig = info["kubeconfig"]
        self.env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        self.ctx = ssl.create_default_context(cafile=str(state / "pki" / "ca.crt"))
        self.ctx.load_cert_chain(str(state / "pki" / "admin.crt"), str(state / "pki" / "admin.key"))

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 600) -> str:
        proc = subprocess.run(
            [self.kubectl_path, *args],
            check=False,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if proc.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(obj))

    def get(self, path: str, query: dict[str, str], accept: str = "application/json") -> Any:
        url = f"{self.info['server']}{path}?{urllib.parse.urlencode(query)}"
        req = urllib.request.Request(url, headers={"Accept": accept})
        with urllib.request.urlopen(req, context=self.ctx, timeout=120) as r:
            return json.loads(r.read())

    def pods_meta(self, ns: str, labels: str, fields: str = "") -> list[dict[str, Any]]:
        """Pods' metadata only (a PartialObjectMetadataList), as the garbage collector reads
        them, filtered on the server."""
        query = {"labelSelector": labels, **({"fieldSelector": fields} if fields else {})}
        accept = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        items: list[dict[str, Any]] = (
            self.get(f"/api/v1/namespaces/{ns}/pods", query, accept).get("items") or []
        )
        return items

    def pods_full(self, ns: str, labels: str) -> list[dict[str, Any]]:
        out = self.kubectl("get", "pods", "-n", ns, "-l", labels, "-o", "json")
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def writes(self) -> dict[str, float]:
        """The apiserver's mutating requests so far, by resource (apiserver_request_total)."""
        server = self.info["server"]
        with urllib.request.urlopen(f"{server}/metrics", context=self.ctx, timeout=30) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            if labels.get("verb") not in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
                continue
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            out[resource] = out.get(resource, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def pid(self, name: str) -> int:
        return int((self.state / "pids" / f"{name}.pid").read_text().split()[0])


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = pred()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- the gang on each side ------------------------------------------------------------------


def megatron_job(name: str, nodes: int, strategy: str | None) -> dict[str, Any]:
    restart: dict[str, Any] = {"backoffSeconds": 0, "maxBackoffSeconds": 0, "maxRestarts": 100}
    if strategy is not None:
        restart["strategy"] = strategy
    return {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name, "namespace": NS_OURS},
        "spec": {
            "image": "trainer:bench",
            "model": {"recipe": "gpt-tiny"},
            "training": {"globalBatchSize": 8 * nodes, "trainIters": 100},
            "data": {"mock": True},
            "resources": {"nodes": nodes, "procsPerNode": 8, "requests": {"cpu": "1"}},
            "topology": {"key": RACK_KEY, "mode": "preferred"},
            "checkpoint": {"volume": {"claimName": "bench"}, "gracePeriodSeconds": 1},
            "restartPolicy": restart,
        },
    }


def rendered_pod(job: dict[str, Any]) -> dict[str, Any]:
    """Our operator's own pod for node rank 0 of `job` (the same renderer it runs)."""
    from megatron_operator.api import load_job
    from megatron_operator.core.planner import plan
    from megatron_operator.core.render import pod

    model = load_job({**job, "metadata": {**job["metadata"], "uid": "template"}})
    return pod(model, plan(model.spec), 0, 0)


def jobset(name: str, nodes: int, our_pod: dict[str, Any]) -> dict[str, Any]:
    """The same gang as a JobSet, as Kubeflow Trainer v2 shapes it: one replicated Job of
    `nodes` indexed pods, no pod retries (backoffLimit 0), the gang recreated on failure."""
    spec = copy.deepcopy(our_pod["spec"])
    for key in ("hostname", "subdomain", "serviceAccountName"):  # JobSet sets its own
        spec.pop(key, None)
    selector = {"matchLabels": {JOBSET_LABEL: name}}
    spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"
    ] = selector
    spec["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0][
        "podAffinityTerm"
    ]["labelSelector"] = selector
    for v in spec["volumes"]:
        if "configMap" in v:
            v["configMap"]["name"] = f"{name}-config"  # created below, like ours
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS_JOBSET},
        "spec": {
            "failurePolicy": {"maxRestarts": 100},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": nodes,
                            "completions": nodes,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": spec},
                        }
                    },
                }
            ],
        },
    }


@dataclass
class Side:
    name: str  # "ours" | "jobset"
    namespace: str
    job_label: str
    attempt_label: str
    controller: Callable[[], int]  # the pid of the side's own controller
    figures: dict[str, list[float]] = field(default_factory=dict)
    detail: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def record(self, figure: str, value: float) -> None:
        self.figures.setdefault(figure, []).append(value)


@contextmanager
def window(c: Cluster, side: Side, figure: str) -> Iterator[None]:
    """CPU-seconds of the control plane's processes, and the apiserver's writes, across a
    block (per restart: the block is one restart)."""
    procs = {
        "controller": side.controller(),
        "kube-controller-manager": c.pid("kube-controller-manager"),
        "kube-apiserver": c.pid("kube-apiserver"),
        "kube-scheduler": c.pid("kube-scheduler"),
        "kwok": c.pid("kwok"),
        "etcd": c.pid("etcd"),
    }
    cpu0 = {k: cpu_seconds(p) for k, p in procs.items()}
    w0 = c.writes()
    yield
    time.sleep(SETTLE_SECONDS)
    cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in procs.items()}
    w1 = c.writes()
    writes = {
        r: w1[r] - w0.get(r, 0.0)
        for r in w1
        if r.split("/")[0] not in BACKGROUND_RESOURCES and w1[r] - w0.get(r, 0.0) > 0
    }
    side.record(f"{figure}_cpu_controller", cpu["controller"] + cpu["kube-controller-manager"])
    side.record(f"{figure}_writes", sum(writes.values()))
    side.detail.setdefault(figure, []).append(
        {**{f"cpu {k}": v for k, v in cpu.items()}, **{f"writes {k}": v for k, v in writes.items()}}
    )


def created_at(items: list[dict[str, Any]]) -> float:
    return max(_ts((p.get("metadata") or p)["creationTimestamp"]) for p in items)


def running_at(items: list[dict[str, Any]]) -> float:
    """When the last pod became Ready (its Ready condition's lastTransitionTime)."""
    times = []
    for p in items:
        conds = p["status"].get("conditions") or []
        ready = [c for c in conds if c.get("type") == "Ready" and c.get("status") == "True"]
        if not ready:
            raise RuntimeError(f"pod {p['metadata']['name']} is Running but not Ready")
        times.append(_ts(ready[0]["lastTransitionTime"]))
    return max(times)


def gang_running(
    c: Cluster, side: Side, name: str, attempt: int, nodes: int, timeout: float
) -> list[dict[str, Any]]:
    labels = f"{side.job_label}={name},{side.attempt_label}={attempt}"
    wait(
        lambda: len(c.pods_meta(side.namespace, labels, "status.phase=Running")) == nodes,
        timeout,
        f"{nodes} Running pods of {side.name} attempt {attempt}",
    )
    items = c.pods_full(side.namespace, labels)
    running = [
        p
        for p in items
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    if len(running) != nodes:
        raise RuntimeError(f"{side.name}: {len(running)} of {nodes} pods Running after the wait")
    return running


def gone(c: Cluster, side: Side, timeout: float = 600) -> None:
    wait(
        lambda: not c.pods_meta(side.namespace, side.job_label), timeout, f"{side.name}'s pods gone"
    )


def create_and_restart(c: Cluster, side: Side, nodes: int, n: int, strategy: str | None) -> None:
    name = f"{side.name}-{n}"
    if side.name == "ours":
        obj = megatron_job(name, nodes, strategy)
    else:
        obj = jobset(name, nodes, rendered_pod(megatron_job(name, nodes, strategy)))
        c.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{name}-config", "namespace": NS_JOBSET},
                "data": {"config.json": "{}"},
            }
        )
    # create
    with window(c, side, "create"):
        t0 = time.time()
        c.apply(obj)
        wait(
            lambda: len(c.pods_meta(side.namespace, f"{side.job_label}={name}")) >= nodes,
            600,
            f"{nodes} pods of {name}",
        )
        items = gang_running(c, side, name, 0, nodes, 900)
    side.record("create_created", created_at(items) - t0)
    side.record("create_running", running_at(items) - t0)
    time.sleep(2)
    # recreate: fail the pod of node rank (completion index) 0
    rank_label = "megatron.dev/node-rank" if side.name == "ours" else JOB_INDEX
    victim = next(
        p["metadata"]["name"] for p in items if p["metadata"]["labels"][rank_label] == "0"
    )
    with window(c, side, "recreate"):
        t0 = time.time()
        fault = subprocess.run(
            [
                str(DRIVER),
                "fail-pod",
                f"{side.namespace}/{victim}",
                "--exit-code",
                "1",
                "--no-wait",
                "--state",
                str(c.state),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        if fault.returncode:
            raise RuntimeError(f"cluster fail-pod {victim}: {fault.stderr.strip()}")
        again = gang_running(c, side, name, 1, nodes, 900)
    side.record("recreate", running_at(again) - t0)
    kind = "megatronjob" if side.name == "ours" else "jobset"
    c.kubectl("delete", kind, "-n", side.namespace, name, "--wait=true", timeout=900)
    gone(c, side)


def inplace_restart(c: Cluster, side: Side, nodes: int, n: int) -> str | None:
    """The slot for our InPlace rung: the decision → every launcher restarted time of one
    failed rank, recorded as the figure `inplace`; returns why there is none. The ratio is
    against JobSet's recreate (JobSet's own in-place restart needs Kubernetes 1.35's
    RestartAllContainers, which this control plane does not have)."""
    from megatron_operator.api.spec import RestartPolicySpec

    if "strategy" not in RestartPolicySpec.model_fields:
        return "the operator has no InPlace rung yet (spec.restartPolicy.strategy)"
    return "the InPlace rung restarts ranks inside running launchers; kwok's pods run none"


# --- the run ---------------------------------------------------------------------------------


def summarise(sides: dict[str, Side], inplace_note: str | None) -> None:
    ours, peer = sides["ours"], sides["jobset"]
    rows = [
        ("create_created", "apply → all pods created (s)"),
        ("create_running", "apply → all pods Running (s)"),
        ("recreate", "one pod failed → gang Running again (s)"),
        ("recreate_cpu_controller", "restart: controller + controller-manager CPU-s"),
        ("recreate_writes", "restart: apiserver writes"),
        ("create_cpu_controller", "create: controller + controller-manager CPU-s"),
        ("create_writes", "create: apiserver writes"),
    ]
    print()
    print(f"{'figure':<50} {'ours (median; runs)':<30} {'JobSet (median; runs)':<30} ratio")
    ratios: dict[str, float] = {}
    for key, label in rows:
        a, b = ours.figures.get(key, []), peer.figures.get(key, [])
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        ratios[key] = ma / mb if mb else float("inf")
        runs_a = ", ".join(f"{x:.1f}" if x < 1000 else f"{x:.0f}" for x in a)
        runs_b = ", ".join(f"{x:.1f}" if x < 1000 else f"{x:.0f}" for x in b)
        print(
            f"{label:<50} {f'{ma:.1f} ({runs_a})':<30} {f'{mb:.1f} ({runs_b})':<30} {ratios[key]:.2f}"
        )
    print()
    for side in (ours, peer):
        for figure, runs in side.detail.items():
            for i, d in enumerate(runs):
                parts = ", ".join(
                    f"{k} {v:.1f}" if "cpu" in k else f"{k} {v:.0f}" for k, v in sorted(d.items())
                )
                print(f"detail {side.name} {figure} #{i + 1}: {parts}")
    print()
    for key in (
        "create_created",
        "create_running",
        "recreate",
        "recreate_cpu_controller",
        "recreate_writes",
    ):
        if key in ratios:
            goal = GOALS.get(key)
            verdict = (
                f" (goal ≤ {goal}: {'met' if ratios[key] <= goal else 'missed'})" if goal else ""
            )
            print(f"ratio {key} ours/jobset = {ratios[key]:.2f}{verdict}")
    a, b = ours.figures.get("inplace", []), peer.figures.get("recreate", [])
    if a and b:
        r = statistics.median(a) / statistics.median(b)
        verdict = "met" if r <= GOALS["inplace"] else "missed"
        print(f"ratio inplace ours/jobset = {r:.2f} (goal ≤ {GOALS['inplace']}: {verdict})")
    else:
        print(f"ratio inplace ours/jobset = n/a ({inplace_note})")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--state", help="a running `cluster up --jobset` cluster (default: start one)"
    )
    parser.add_argument(
        "--nodes", type=int, default=1024, help="nodes, and pods in the gang (1024)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs both sides (2)")
    args = parser.parse_args()
    started = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="peer-jobset-"))
    load_before = os.getloadavg()
    print(
        f"machine: {platform.node()}, {psutil.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load before "
        f"{load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f}; "
        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        flush=True,
    )
    if started:
        print(f"starting a {args.nodes}-node cluster with JobSet in {state} …", flush=True)
        t = time.monotonic()
        subprocess.run(
            [
                str(DRIVER),
                "up",
                "--state",
                str(state),
                "--nodes",
                str(args.nodes),
                "--nodes-per-rack",
                "4",
                "--jobset",
                "--timeout",
                "900",
            ],
            check=True,
            capture_output=True,
        )
        print(f"cluster up in {time.monotonic() - t:.0f} s", flush=True)
    c = Cluster(state)
    op: subprocess.Popen[bytes] | None = None
    try:
        c.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(REPO / "crds" / "megatronjobs.megatron.dev.yaml"),
        )
        c.kubectl("wait", "--for=condition=Established", "crd/megatronjobs.megatron.dev")
        for ns in (NS_OURS, NS_JOBSET):
            c.kubectl("create", "namespace", ns)
            c.apply(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "bench", "namespace": ns},
                    "spec": {
                        "accessModes": ["ReadWriteMany"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            )
        log = state / "peer-operator.log"
        op = subprocess.Popen(
            [sys.executable, "-m", "megatron_operator.cli.main", "operator", "--metrics-port=0"],
            env=c.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(5)
        pid = op.pid
        sides = {
            "ours": Side("ours", NS_OURS, OUR_JOB_LABEL, OUR_ATTEMPT, lambda: pid),
            "jobset": Side(
                "jobset", NS_JOBSET, JOBSET_LABEL, JOBSET_ATTEMPT, lambda: c.pid("jobset")
            ),
        }
        from megatron_operator.api.spec import RestartPolicySpec

        strategy = "Recreate" if "strategy" in RestartPolicySpec.model_fields else None
        for r in range(args.rounds):
            order = ("ours", "jobset") if r % 2 == 0 else ("jobset", "ours")
            for name in order:
                t = time.monotonic()
                create_and_restart(c, sides[name], args.nodes, r, strategy)
                s = sides[name].figures
                print(
                    f"round {r + 1} {name}: created {s['create_created'][-1]:.1f} s, Running "
                    f"{s['create_running'][-1]:.1f} s, recreate → Running {s['recreate'][-1]:.1f} s "
                    f"({time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        note = inplace_restart(c, sides["ours"], args.nodes, args.rounds)
        summarise(sides, note)
        load_after = os.getloadavg()
        print(f"load after {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f}", flush=True)
    finally:
        if op is not None and op.poll() is None:
            op.send_signal(signal.SIGTERM)
            op.wait(timeout=60)
        if started:
            subprocess.run(
                [str(DRIVER), "down", "--state", str(state)], check=False, capture_output=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
