"""Operator scale on the local control plane (kube-apiserver + scheduler + kwok nodes).

Measures, with the operator running as a process (`mjob operator`):
  1. apply → all pods created, for a 1,024-pod job (goal ≤ 10 s, ≥ 100 pods/s);
  2. failure seen → all pods of the next attempt created, for 128 and 1,024 pods
     (goal ≤ 5 s and ≤ 30 s); the old pods must be gone first, and kwok takes 1 s to remove a
     deleted pod, which is part of the figure;
  3. the operator's peak RSS with 100 concurrent jobs (8 pods each).

Run: python benchmarks/operator_scale.py            (starts a 1,024-node kwok cluster itself)
     python benchmarks/operator_scale.py --nodes 128 (a smaller cluster; figures that need more
                                                      nodes than it has are skipped)
     python benchmarks/operator_scale.py --state DIR (reuse a running cluster)
Needs `tests/cluster/cluster build` (cached binaries). Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "cluster" / "cluster"


class Bench:
    def __init__(self, state: Path, keep: bool) -> None:
        self.state = state
        self.keep = keep
        info = json.loads((state / "cluster.json").read_text())
        self.kubectl_path = info["kubectl"]
        self.kubeconfig = info["kubeconfig"]
        self.env = {**os.environ, "KUBECONFIG": self.kubeconfig}
        self.op: subprocess.Popen[bytes] | None = None
        self.api = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl_path, *args],
            check=False,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=600,
        )
        if proc.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def start_operator(self, log: Path) -> None:
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            str(REPO / "crds" / "megatronjobs.megatron.dev.yaml"),
        )

        # Right after the apply the CRD may have no conditions yet, and kubectl wait then fails
        # at once rather than waiting: look again.
        def established() -> bool:
            crd = json.loads(self.kubectl("get", "crd/megatronjobs.megatron.dev", "-o", "json"))
            conditions = (crd.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        _wait(established, 60, "the CRD established", 0.5)
        self.op = subprocess.Popen(
            [sys.executable, "-m", "megatron_operator.cli.main", "operator", "--metrics-port=0"],
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(4)

    def stop_operator(self) -> None:
        if self.op and self.op.poll() is None:
            self.op.send_signal(signal.SIGTERM)
            self.op.wait(timeout=60)

    def pods(self, ns: str, job: str) -> list[dict[str, Any]]:
        out = self.kubectl(
            "get", "pods", "-n", ns, "-l", f"megatron.dev/job-name={job}", "-o", "json"
        )
        items: list[dict[str, Any]] = json.loads(out)["items"]
        return items

    def pod_metadata(self, ns: str, selector: str) -> list[dict[str, Any]]:
        """Pods' metadata only (a PartialObjectMetadataList), as the garbage collector reads
        them. The measured waits poll with this: a full `-o json` list of 1,024 pods every
        second cost the apiserver and kubectl about half a core here, taken from the very
        control plane being measured."""
        # The pinned client (kubernetes 36) has call_api(path, method, ...), no param_serialize.
        resp = self.api.call_api(
            f"/api/v1/namespaces/{ns}/pods",
            "GET",
            query_params=[("labelSelector", selector)],
            header_params={
                "Accept": "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            },
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=60,
        )
        raw = resp[0] if isinstance(resp, tuple) else resp
        items: list[dict[str, Any]] = json.loads(raw.data).get("items") or []
        return items

    def job(self, ns: str, name: str, nodes: int, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "image": "trainer:bench",
                "model": {"recipe": "gpt-tiny"},
                "training": {"globalBatchSize": 8 * nodes, "trainIters": 100},
                "data": {"mock": True},
                "resources": {"nodes": nodes, "procsPerNode": 8, "requests": {"cpu": "1"}},
                "checkpoint": {"volume": {"claimName": "bench"}, "gracePeriodSeconds": 1},
                # The gang restart measured here is the Recreate rung (kwok runs no launcher).
                "restartPolicy": {
                    "backoffSeconds": 0,
                    "maxBackoffSeconds": 0,
                    "maxRestarts": 100,
                    "strategy": "Recreate",
                },
                **spec,
            },
        }
        return body


PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "bench"},
    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
}


def _wait(pred: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = pred()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(what)


def _created(pods: list[dict[str, Any]]) -> float:
    """Wall time (epoch s) when the last of these pods was created, from creationTimestamp (1 s
    resolution: figures are ±1 s). Polling a 1,024-pod list takes seconds here, so the poll time
    would overstate the operator's time."""
    return max(
        datetime.fromisoformat(
            (p.get("metadata") or p)["creationTimestamp"].replace("Z", "+00:00")
        ).timestamp()
        for p in pods
    )


class Paused:
    """SIGSTOP the scheduler and kwok: isolates operator + apiserver from the other control-
    plane work competing for this machine's 2 cores."""

    def __init__(self, b: Bench, on: bool) -> None:
        self.pids = (
            [
                int((b.state / "pids" / f"{c}.pid").read_text().split()[0])
                for c in ("kube-scheduler", "kwok")
            ]
            if on
            else []
        )

    def __enter__(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


def apply_to_created(b: Bench, ns: str, nodes: int, isolate: bool) -> float:
    name = f"apply{nodes}{'i' if isolate else ''}"
    selector = f"megatron.dev/job-name={name}"
    with Paused(b, isolate):
        t0 = time.time()
        b.kubectl("apply", "-f", "-", input=json.dumps(b.job(ns, name, nodes)))
        items = _wait(
            lambda: (p := b.pod_metadata(ns, selector)) and len(p) == nodes and p,
            300,
            f"{nodes} pods",
            1.0,
        )
    elapsed = _created(items) - t0
    b.kubectl("delete", "mj", "-n", ns, name, "--wait=true")
    return elapsed


def failure_to_recreated(b: Bench, ns: str, nodes: int) -> float:
    name = f"restart{nodes}"
    b.kubectl("apply", "-f", "-", input=json.dumps(b.job(ns, name, nodes)))
    _wait(
        lambda: sum(p["status"].get("phase") == "Running" for p in b.pods(ns, name)) == nodes,
        600,
        "running",
        1.0,
    )
    _wait(
        lambda: (
            json.loads(b.kubectl("get", "mj", "-n", ns, name, "-o", "json"))
            .get("status", {})
            .get("phase")
            == "Running"
        ),
        120,
        "phase",
    )
    # The current attempt's rank 0 (a slow start may already have restarted the job once).
    running = b.pods(ns, name)
    attempt = max(int(p["metadata"]["labels"]["megatron.dev/restart-attempt"]) for p in running)
    victim = next(
        p["metadata"]["name"]
        for p in running
        if p["metadata"]["labels"]["megatron.dev/restart-attempt"] == str(attempt)
        and p["metadata"]["labels"]["megatron.dev/node-rank"] == "0"
    )
    t0 = time.time()
    fault = subprocess.run(
        [
            str(DRIVER),
            "fail-pod",
            f"{ns}/{victim}",
            "--exit-code",
            "1",
            "--no-wait",
            "--state",
            str(b.state),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    if fault.returncode:
        raise RuntimeError(f"cluster fail-pod {ns}/{victim}: {fault.stderr.strip()}")
    nxt = str(attempt + 1)

    selector = f"megatron.dev/job-name={name},megatron.dev/restart-attempt={nxt}"

    def recreated() -> list[dict[str, Any]] | None:
        new = b.pod_metadata(ns, selector)
        return new if len(new) == nodes else None

    items = _wait(recreated, 600, f"attempt {nxt} pods", interval=1.0)
    return _created(items) - t0


def peak_rss(b: Bench, ns: str, jobs: int, nodes: int) -> tuple[float, float]:
    assert b.op is not None
    proc = psutil.Process(b.op.pid)
    peak = [proc.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    items = [b.job(ns, f"many{i}", nodes) for i in range(jobs)]
    b.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}),
    )
    _wait(
        lambda: (
            len(json.loads(b.kubectl("get", "pods", "-n", ns, "-o", "json"))["items"])
            >= jobs * nodes
        ),
        600,
        "all pods",
        interval=1,
    )
    time.sleep(10)  # steady state: every job reconciled and resyncing
    stop.set()
    t.join()
    return peak[0] / 2**20, proc.memory_info().rss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument(
        "--nodes", type=int, default=1024, help="kwok nodes when starting a cluster"
    )
    args = parser.parse_args()
    started = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="megatron-bench-"))
    if started:
        print(f"starting a {args.nodes}-node cluster in {state} …", flush=True)
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
                "--timeout",
                "600",
            ],
            check=True,
            capture_output=True,
        )
    b = Bench(state, keep=not started)
    log = state / "bench-operator.log"
    print(f"machine: {platform.node()}, {psutil.cpu_count()} cores; operator log {log}")
    try:
        b.start_operator(log)
        for ns in ("bench-apply", "bench-restart", "bench-rss"):
            b.kubectl("create", "namespace", ns)
            b.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(PVC))
        nodes = len(json.loads(b.kubectl("get", "nodes", "-o", "json"))["items"])
        print(f"cluster: {nodes:,} nodes", flush=True)
        if nodes < 1024:
            print(f"apply → 1,024 pods: skipped, the cluster has {nodes:,} nodes", flush=True)
        for isolate in (False, True) if nodes >= 1024 else ():
            t = apply_to_created(b, "bench-apply", 1024, isolate)
            how = "scheduler and kwok paused" if isolate else "scheduler and kwok running"
            print(
                f"apply → 1,024 pods created ({how}): {t:.1f} s ({1024 / max(t, 0.5):.0f} pods/s; goal ≤ 10 s)",
                flush=True,
            )
        for n, goal in ((128, 5), (1024, 30)):
            if n > nodes:
                print(f"failure → {n:,} pods: skipped, the cluster has {nodes:,} nodes", flush=True)
                continue
            t = failure_to_recreated(b, "bench-restart", n)
            print(
                f"failure → {n:,} pods of the next attempt created: {t:.1f} s (goal ≤ {goal} s)",
                flush=True,
            )
            b.kubectl("delete", "mj", "-n", "bench-restart", f"restart{n}", "--wait=true")
        peak, steady = peak_rss(b, "bench-rss", 100, 8)
        print(
            f"operator RSS with 100 jobs × 8 pods: peak {peak:.0f} MiB, steady {steady:.0f} MiB",
            flush=True,
        )
    finally:
        b.stop_operator()
        if started:
            subprocess.run(
                [str(DRIVER), "down", "--state", str(state)], check=False, capture_output=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
