"""Kill → first resumed step on real kubelets: the InPlace rung against the Recreate rung.

One cluster (the control plane, 2 real nodes: containerd + kubelet in network namespaces), the
operator installed by the chart, the CPU trainer image built from Dockerfile.trainer. The same
2-pod job (2 gloo ranks a pod, PP=2 across the pods) runs once per strategy and repeat,
alternating, so load drifts hit both. At iteration 8 one rank process of node rank 0's pod is
SIGKILLed (`cluster kill-process`: a rank, not the container):

- InPlace: the launcher reports it, the operator decides, and after the backoff every launcher
  starts the next attempt's ranks in the same pods (forked by each pod's zygote);
- Recreate: the launcher exits with the rank's code, the pod fails, and the operator deletes
  both pods and creates the next attempt's.

Both figures run from the moment the launcher saw the rank die (its log line) to rank 0's
first progress line of the next attempt, both as the container runtime stamped them
(`kubectl logs --timestamps`, one clock). Goal: InPlace at least 3× faster. Both pay the same
1 s backoff (the restart-loop floor).

Run (as root, with the real-node packages; see docs/e2e.md):
    python benchmarks/restart_ladder_real.py [--repeat 3] [--state DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.cluster_support import Cluster  # noqa: E402
from tests.integration.real_nodes_support import (  # noqa: E402
    RealCluster,
    install_operator,
    start_real_cluster,
)
from tests.integration.test_e2e import job_doc, spec  # noqa: E402

PROGRESS = "MEGATRON_PROGRESS "
KILLED = ("local rank 1 of attempt 0 exited with 137", "local rank 1 exited with 137")


class Rank0Log:
    """Every line of node rank 0's pods, with the runtime's timestamp (`kubectl logs -f
    --timestamps`): a Recreate deletes the pod, so the log is read while it is written."""

    def __init__(self, c: RealCluster, ns: str, job: str) -> None:
        self.c, self.ns, self.job = c, ns, job
        self.lines: list[tuple[float, str]] = []
        self.followed: set[str] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            out = self.c.kubectl(
                "get", "pods", "-n", self.ns, "-l",
                f"megatron.dev/job-name={self.job},megatron.dev/node-rank=0", "-o", "json",
                check=False,
            )  # fmt: skip
            if out.returncode == 0:
                for pod in json.loads(out.stdout)["items"]:
                    name = pod["metadata"]["name"]
                    statuses = pod.get("status", {}).get("containerStatuses") or []
                    up = any("running" in (s.get("state") or {}) for s in statuses)
                    if up and name not in self.followed:
                        self.followed.add(name)
                        threading.Thread(target=self._follow, args=(name,), daemon=True).start()
            time.sleep(0.2)

    def _follow(self, pod: str) -> None:
        argv = [str(self.c.kubectl_path), "logs", "-f", "--timestamps", "-n", self.ns, pod]
        with subprocess.Popen(argv, env=self.c.env, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                stamp, _, text = line.rstrip("\n").partition(" ")
                when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                with self.lock:
                    self.lines.append((when, text))

    def progress(self) -> Iterator[tuple[float, dict[str, Any]]]:
        with self.lock:
            lines = list(self.lines)
        for when, text in lines:
            if text.startswith(PROGRESS):
                yield when, json.loads(text[len(PROGRESS) :])

    def iteration(self) -> int:
        return max((r["iteration"] for _, r in self.progress()), default=0)

    def killed_at(self) -> float | None:
        with self.lock:
            return next((t for t, text in self.lines if any(k in text for k in KILLED)), None)

    def resumed_at(self) -> tuple[float, dict[str, Any]] | None:
        return next(((t, r) for t, r in self.progress() if r.get("attempt", 0) >= 1), None)

    def text(self) -> str:
        with self.lock:
            return "\n".join(text for _, text in self.lines)


def one(c: RealCluster, strategy: str) -> dict[str, float]:
    ns = f"bench-{strategy.lower()}-{uuid.uuid4().hex[:6]}"
    c.kubectl("create", "namespace", ns)
    s = spec(c.image("trainer"), **{
        "restartPolicy.strategy": strategy, "training.trainIters": 40,
    })  # fmt: skip
    c.apply(job_doc("bench", s), ns)
    log = Rank0Log(c, ns, "bench")
    try:
        c.wait(lambda: log.iteration() >= 8, 600, 0.2, "iteration 8")
        if strategy == "InPlace":
            # A restart's ranks are forked by the pod's zygote, which has imported torch:
            # give them the time they take on this machine (the delay, then the imports).
            time.sleep(25)
        pod = next(
            p["metadata"]["name"]
            for p in c.kubectl_json("get", "pods", "-n", ns, "-l", "megatron.dev/node-rank=0")[
                "items"
            ]
        )
        c.kill_process(ns, pod, "megatron_trainer.worker", RANK="1")
        resumed = c.wait(log.resumed_at, 600, 0.2, "the first step of attempt 1")
        killed = log.killed_at()
        assert killed is not None, log.text()[-3000:]
        status = c.kubectl_json("get", "mj", "-n", ns, "bench")["status"]
        return {
            "kill → first resumed step": resumed[0] - killed,
            "resumed at iteration": float(resumed[1]["iteration"]),
            "restarts": float(status["restarts"]),
            "warm": float("forked by the pod's zygote" in log.text()),
            "rung": 0.0 if status["lastFailure"]["rung"] == "InPlace" else 1.0,
        }
    finally:
        log.stop.set()
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--state", help="a running real-node cluster to reuse (operator included)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("real nodes need root (network namespaces, containerd, kubelet)")
    own = args.state is None
    if own:
        print("starting a cluster with 2 real nodes (minutes) …", flush=True)
        c = start_real_cluster(2)
    else:
        state = Path(args.state)
        base = Cluster(state, json.loads((state / "cluster.json").read_text()), owned=False)
        c = RealCluster(state_dir=base.state_dir, info=base.info)
    installed = install_operator(c) if own else None
    if installed is not None:
        next(installed)
    print(
        f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[str, list[dict[str, float]]] = {"InPlace": [], "Recreate": []}
    try:
        for i in range(args.repeat):
            for strategy in ("InPlace", "Recreate") if i % 2 == 0 else ("Recreate", "InPlace"):
                r = one(c, strategy)
                results[strategy].append(r)
                print(
                    f"{strategy} run {len(results[strategy])}: kill → first resumed step "
                    f"{r['kill → first resumed step']:.1f} s (resumed at iteration "
                    f"{r['resumed at iteration']:.0f}, restarts {r['restarts']:.0f}"
                    + (", ranks forked by the pods' zygotes" if r["warm"] else "")
                    + f"; load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        key = "kill → first resumed step"
        inplace = statistics.median(r[key] for r in results["InPlace"])
        recreate = statistics.median(r[key] for r in results["Recreate"])
        print(
            f"kill → first resumed step, median of {args.repeat}: InPlace {inplace:.1f} s, "
            f"Recreate {recreate:.1f} s; ratio Recreate/InPlace = {recreate / inplace:.1f}× "
            "(goal ≥ 3×)",
            flush=True,
        )
    finally:
        if installed is not None:
            installed.close()
        if own:
            c.down()
            shutil.rmtree(c.state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
