"""The operator's memory with one job at the node cap (issue 15: bounded memory).

One MegatronJob may ask for at most `MAX_NODES` pods (the CRD refuses more). This starts the
operator as a process (`mjob operator`) against the local control plane, applies a job at the cap,
waits until all of its pods exist, and samples the operator's RSS throughout. The peer in the same
run is the same operator with one 8-pod job: the ratio says what the cap costs.

Pods need no nodes to exist: they stay Pending, which is all the operator's memory depends on
(it renders, creates, lists and watches them), so a 2-node cluster suffices.

Run: python benchmarks/operator_cap_memory.py              (starts a small cluster itself)
     python benchmarks/operator_cap_memory.py --state DIR  (reuse a running cluster)
     python benchmarks/operator_cap_memory.py --nodes 512  (a smaller job, for a quick look)
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
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "cluster" / "cluster"
sys.path.insert(0, str(REPO / "operator"))

from megatron_contract.bounds import MAX_NODES  # noqa: E402


class Operator:
    def __init__(self, state: Path) -> None:
        info = json.loads((state / "cluster.json").read_text())
        self.kubectl_path = info["kubectl"]
        self.env = {**os.environ, "KUBECONFIG": info["kubeconfig"]}
        self.state = state
        self.proc: subprocess.Popen[bytes] | None = None

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl_path, *args],
            check=False,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=900,
        )
        if proc.returncode:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def start(self, log: Path) -> None:
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "megatronjobs.megatron.dev.yaml"),
        )  # fmt: skip
        self.kubectl("wait", "--for=condition=Established", "crd/megatronjobs.megatron.dev")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_operator.cli.main", "operator", "--metrics-port=0"],
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=120)

    def pod_count(self, ns: str, name: str) -> int:
        out = self.kubectl(
            "get", "pods", "-n", ns, "-l", f"megatron.dev/job-name={name}", "-o", "name"
        )
        return len(out.split())


def job(name: str, nodes: int) -> dict[str, Any]:
    procs = 8
    return {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name},
        "spec": {
            "image": "trainer:bench",
            "model": {"recipe": "gpt-tiny"},
            "training": {"globalBatchSize": nodes * procs, "trainIters": 100},
            "data": {"mock": True},
            "resources": {"nodes": nodes, "procsPerNode": procs, "requests": {"cpu": "1"}},
            "checkpoint": {"volume": {"claimName": "bench"}, "gracePeriodSeconds": 1},
        },
    }


def measure(op: Operator, ns: str, name: str, nodes: int) -> tuple[float, float, float]:
    """(seconds to create every pod, peak RSS MiB, steady RSS MiB)."""
    assert op.proc is not None
    proc = psutil.Process(op.proc.pid)
    peak = [proc.memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    op.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job(name, nodes)))
    deadline = t0 + 1800
    while op.pod_count(ns, name) < nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{nodes} pods not created in 30 min")
        time.sleep(2)
    took = time.monotonic() - t0
    time.sleep(20)  # steady state: reconciles of the full gang
    stop.set()
    sampler.join()
    return took, peak[0] / 2**20, proc.memory_info().rss / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument("--nodes", type=int, default=MAX_NODES, help="pods of the big job")
    args = parser.parse_args()
    if not 8 < args.nodes <= MAX_NODES:
        parser.error(f"--nodes must be 9..{MAX_NODES} (the cap)")
    started = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="megatron-cap-"))
    if started:
        print(f"starting a 2-node cluster in {state} …", flush=True)
        subprocess.run(
            [str(DRIVER), "up", "--state", str(state), "--nodes", "2", "--timeout", "600"],
            check=True,
            capture_output=True,
        )
    op = Operator(state)
    print(f"machine: {platform.node()}, {psutil.cpu_count()} cores; cap {MAX_NODES:,} pods/job")
    try:
        for ns in ("cap-small", "cap-big"):
            op.kubectl("create", "namespace", ns)
            op.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(PVC))
        op.start(state / "cap-operator.log")
        small = measure(op, "cap-small", "small", 8)
        print(
            f"peer, one 8-pod job: peak {small[1]:.0f} MiB, steady {small[2]:.0f} MiB", flush=True
        )
        big = measure(op, "cap-big", "big", args.nodes)
        print(
            f"one job at {args.nodes:,} pods: created in {big[0]:.0f} s; operator RSS peak "
            f"{big[1]:.0f} MiB ({big[1] / small[1]:.2f}× the peer), steady {big[2]:.0f} MiB",
            flush=True,
        )
    finally:
        op.stop()
        if started:
            subprocess.run(
                [str(DRIVER), "down", "--state", str(state)], check=False, capture_output=True
            )
    return 0


PVC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "bench"},
    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
}

if __name__ == "__main__":
    sys.exit(main())
