"""Many jobs on one operator: memory, CPU and apiserver writes, at rest and under a Lease storm.

On the local control plane (kube-apiserver + scheduler + kwok nodes), with the operator running
as a process (`mjob operator`):

1. creates JOBS MegatronJobs whose bodies are padded to BODY_KB (spec.env values): TERMINAL of
   them already Succeeded (their status written before the operator starts), the others running
   one CPU pod each (kwok runs it);
2. starts the operator and waits until every running job is Running;
3. measures a quiet window (WINDOW s): the operator's RSS and CPU, and the apiserver's write
   requests per second (its own apiserver_request_total, verbs POST/PUT/PATCH/DELETE), among them
   MegatronJob status writes;
4. a Lease write storm: STORM_THREADS threads write the progress Lease of every running job, each
   a newer record, as fast as the apiserver takes them, for WINDOW s; the same figures.

`--peer REF` runs steps 2-4 again with the operator of git revision REF (checked out with
`git archive` into a temporary directory), on the same cluster with the jobs made again (an
older operator may not take this one's pods as its own), and prints the ratios.

Run: python benchmarks/many_jobs.py                      (starts a 24-node kwok cluster)
     python benchmarks/many_jobs.py --state DIR          (reuse a running cluster)
     python benchmarks/many_jobs.py --jobs 2000 --terminal 1000 --body-kb 100 --peer 6f2a4f8
     python benchmarks/many_jobs.py --nodes 1024 --jobs 100 --terminal 0 --pods 8 --body-kb 4 \
         --peer 3fde90c                     (the ledger's cost: 3fde90c is main before it)
Needs `tests/cluster/cluster build`. Prints one line per figure, then a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import psutil

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "cluster" / "cluster"
GROUP, VERSION, PLURAL = "megatron.dev", "v1alpha1", "megatronjobs"
NS = "many-jobs"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    def __init__(self, state: Path) -> None:
        info = json.loads((state / "cluster.json").read_text())
        self.kubectl_path = info["kubectl"]
        self.kubeconfig = info["kubeconfig"]
        self.env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        self.api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]
        self.api.configuration.connection_pool_maxsize = 64
        self.custom = kubernetes.client.CustomObjectsApi(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.coordination = kubernetes.client.CoordinationV1Api(self.api)

    def kubectl(self, *args: str) -> str:
        proc = subprocess.run(
            [self.kubectl_path, *args],
            check=False,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=600,
        )
        if proc.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def writes(self) -> dict[str, float]:
        """The apiserver's write requests so far: all, and MegatronJob status writes."""
        text = self.kubectl("get", "--raw", "/metrics")
        total = status = 0.0
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("verb") not in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
                continue
            value = float(line.rsplit(" ", 1)[1])
            total += value
            if labels.get("resource") == PLURAL and labels.get("subresource") == "status":
                status += value
        return {"writes": total, "status_writes": status}


def job(name: str, running: bool, body_kb: int, pods: int = 1) -> dict[str, Any]:
    pad = max(body_kb * 1024 - 2048, 0)
    entries = (pad // 30000) + (1 if pad % 30000 else 0)
    env = [{"name": f"PAD_{i}", "value": "x" * min(30000, pad - i * 30000)} for i in range(entries)]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "MegatronJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "image": "trainer:bench",
            "model": {"recipe": "gpt-tiny"},
            "training": {"globalBatchSize": 8, "trainIters": 1000},
            "data": {"mock": True},
            "resources": {"nodes": pods, "procsPerNode": 1, "accelerator": "none"},
            "checkpoint": {"volume": {"claimName": "bench-shared"}, "gracePeriodSeconds": 1},
            "restartPolicy": {"hangTimeoutSeconds": 0},
            "env": env,
        },
    }


def create_jobs(c: Cluster, jobs: int, terminal: int, body_kb: int, pods: int) -> list[str]:
    """Create the jobs (terminal ones already Succeeded); return the running jobs' names."""
    c.kubectl("create", "namespace", NS)
    # One claim the pods all mount (a claim that does not exist would keep them Pending).
    c.core.create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": "bench-shared"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "shared-hostpath",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    running = []

    def make(i: int) -> None:
        name = f"job-{i:04d}"
        is_running = i >= terminal
        doc = c.custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, job(name, is_running, body_kb, pods)
        )
        if not is_running:
            doc["status"] = {
                "phase": "Succeeded",
                "completionTime": _now(),
                "startTime": _now(),
                "conditions": [
                    {
                        "type": "Succeeded",
                        "status": "True",
                        "reason": "Completed",
                        "message": "all 1 pods exited 0",
                        "lastTransitionTime": _now(),
                    }
                ],
            }
            c.custom.replace_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, name, doc)
        else:
            running.append(name)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(make, range(jobs)))
    return sorted(running)


class Operator:
    def __init__(self, c: Cluster, log: Path, pythonpath: str | None = None) -> None:
        env = dict(c.env)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_operator.cli.main", "operator", "--metrics-port=0"],
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            cwd=pythonpath or REPO,
        )
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def rss_mb(self) -> float:
        return float(self.ps.memory_info().rss) / 2**20

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_running(c: Cluster, names: list[str], timeout: float) -> float:
    start = time.monotonic()
    want = set(names)
    while True:
        items = c.custom.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
        running = {
            j["metadata"]["name"]
            for j in items
            if (j.get("status") or {}).get("phase") == "Running"
        }
        if want <= running:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"{len(want - running)} jobs not Running after {timeout:.0f} s")
        time.sleep(5)


def window(
    c: Cluster, op: Operator, seconds: float, storm: list[str] | None, threads: int
) -> dict[str, float]:
    """Measure for `seconds`; with `storm`, write those jobs' Leases meanwhile."""
    stop = threading.Event()
    lease_writes = [0]
    lock = threading.Lock()

    def writer(names: list[str]) -> None:
        step = 0
        while not stop.is_set():
            step += 1
            for name in names:
                if stop.is_set():
                    return
                record = json.dumps({"attempt": 0, "iteration": step, "loss": 2.0, "time": _now()})
                body = {
                    "metadata": {"annotations": {"megatron.dev/progress": record}},
                    "spec": {"renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
                }
                try:
                    c.coordination.patch_namespaced_lease(f"{name}-progress", NS, body)
                except Exception:  # a refusal or a timeout of a loaded apiserver: keep writing
                    continue
                with lock:
                    lease_writes[0] += 1

    before_api, before_cpu = c.writes(), op.cpu()
    rss_peak = op.rss_mb()
    workers = []
    if storm:
        for k in range(threads):
            t = threading.Thread(target=writer, args=(storm[k::threads],), daemon=True)
            t.start()
            workers.append(t)
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(1)
        rss_peak = max(rss_peak, op.rss_mb())
    stop.set()
    for t in workers:
        t.join(timeout=30)
    took = time.monotonic() - start
    after_api, after_cpu = c.writes(), op.cpu()
    return {
        "seconds": took,
        "operator_cpu_cores": (after_cpu - before_cpu) / took,
        "operator_rss_mb": op.rss_mb(),
        "operator_rss_peak_mb": rss_peak,
        "apiserver_writes_per_s": (after_api["writes"] - before_api["writes"]) / took,
        "job_status_writes_per_s": (after_api["status_writes"] - before_api["status_writes"])
        / took,
        "lease_writes_per_s": lease_writes[0] / took,
    }


def run_operator(
    c: Cluster,
    label: str,
    log: Path,
    running: list[str],
    args: argparse.Namespace,
    pythonpath: str | None,
) -> dict[str, Any]:
    op = Operator(c, log, pythonpath)
    try:
        settled = wait_running(c, running, args.timeout)
        time.sleep(args.settle)  # let the start-up work finish before measuring
        quiet = window(c, op, args.window, None, args.threads)
        storm = window(c, op, args.window, running, args.threads)
        if op.proc.poll() is not None:
            raise RuntimeError(f"the {label} operator exited; see {log}")
    finally:
        op.stop()
    out = {"settled_s": settled, "quiet": quiet, "storm": storm}
    print(
        f"[{label}] all {len(running)} running jobs Running {settled:.0f} s after start", flush=True
    )
    for name, w in (("quiet", quiet), ("storm", storm)):
        print(
            f"[{label}] {name}: operator RSS {w['operator_rss_mb']:.0f} MiB "
            f"(peak {w['operator_rss_peak_mb']:.0f}), CPU {w['operator_cpu_cores']:.2f} cores, "
            f"apiserver writes {w['apiserver_writes_per_s']:.1f}/s, of which job status "
            f"{w['job_status_writes_per_s']:.2f}/s; Lease writes {w['lease_writes_per_s']:.1f}/s",
            flush=True,
        )
    return out


def peer_checkout(ref: str) -> Path:
    """The operator package and the CRDs of git revision `ref`, in a temporary directory."""
    tmp = tempfile.mkdtemp(prefix="many-jobs-peer-")
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "operator", "crds"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
    return Path(tmp)


def apply_crd(c: Cluster, root: Path) -> None:
    c.kubectl(
        "apply", "--server-side", "--force-conflicts",
        "-f", str(root / "crds" / "megatronjobs.megatron.dev.yaml"),
    )  # fmt: skip
    for _ in range(60):  # `kubectl wait` fails while the CRD has no conditions yet
        try:
            c.kubectl("wait", "--for=condition=Established", "crd/megatronjobs.megatron.dev")
            return
        except RuntimeError:
            time.sleep(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument("--nodes", type=int, default=24, help="kwok nodes when starting one")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--terminal", type=int, default=1000, help="jobs already Succeeded")
    parser.add_argument("--body-kb", type=int, default=100, help="size each job is padded to")
    parser.add_argument("--pods", type=int, default=1, help="pods (nodes) of each running job")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per measurement")
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=8, help="Lease writers in the storm")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--peer", help="git revision whose operator to measure the same way")
    args = parser.parse_args()

    owned = None
    if args.state:
        state = Path(args.state)
    else:
        state = Path(tempfile.mkdtemp(prefix="many-jobs-"))
        subprocess.run(
            [str(DRIVER), "up", "--state", str(state), "--nodes", str(args.nodes),
             "--pods-per-node", "110", "--pvs", "2"],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        owned = state
    logs = Path(tempfile.mkdtemp(prefix="many-jobs-logs-"))
    results: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "load_at_start": os.getloadavg(),
        "jobs": args.jobs,
        "terminal": args.terminal,
        "body_kb": args.body_kb,
        "pods_per_job": args.pods,
        "nodes": args.nodes,
    }
    try:
        c = Cluster(state)
        apply_crd(c, REPO)
        started = time.monotonic()
        running = create_jobs(c, args.jobs, args.terminal, args.body_kb, args.pods)
        sample = c.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, running[0])
        size = len(json.dumps(sample))
        results["body_bytes"] = size
        print(
            f"created {args.jobs} jobs ({args.terminal} Succeeded, {len(running)} to run) of "
            f"{size / 1024:.0f} KiB each in {time.monotonic() - started:.0f} s",
            flush=True,
        )
        results["ours"] = run_operator(c, "this operator", logs / "ours.log", running, args, None)
        if args.peer:
            peer = peer_checkout(args.peer)
            path = str(peer / "operator")
            # Fresh jobs for the peer: an operator of another revision may not take the pods
            # this one made as its own (it would delete them and start over). Under its own
            # CRD: today's defaults fields it does not know, and it would refuse every job.
            c.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=600s")
            apply_crd(c, peer)
            running = create_jobs(c, args.jobs, args.terminal, args.body_kb, args.pods)
            results["peer"] = run_operator(
                c, f"peer {args.peer}", logs / "peer.log", running, args, path
            )
            for name in ("quiet", "storm"):
                ours, peer = results["ours"][name], results["peer"][name]
                ratios = {
                    k: (ours[k] / peer[k]) if peer[k] else None
                    for k in ("operator_rss_mb", "operator_cpu_cores", "apiserver_writes_per_s",
                              "job_status_writes_per_s")
                }  # fmt: skip
                results.setdefault("ratios", {})[name] = ratios
                # What this operator adds over the peer, per running job (the ledger's budget:
                # at most one status write per 30 s per job).
                extra = (ours["job_status_writes_per_s"] - peer["job_status_writes_per_s"]) / len(
                    running
                )
                results.setdefault("extra_status_writes_per_job_per_30s", {})[name] = extra * 30
                print(
                    f"[ours - peer] {name}: job status writes {extra * 30:+.2f} per 30 s per job",
                    flush=True,
                )
                print(
                    f"[ours / peer] {name}: "
                    + ", ".join(
                        f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in ratios.items()
                    ),
                    flush=True,
                )
        print(json.dumps(results, indent=1))
    finally:
        print(f"operator logs: {logs}", flush=True)
        if owned is not None:
            subprocess.run([str(DRIVER), "down", "--state", str(owned)], check=False)
            shutil.rmtree(owned, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
