"""How fast the pure core is: plan 131,072 ranks (16,384 nodes × 8) and render 1,024 pods.

Goals (issue 2): plan ≤ 1 s, render ≤ 1 s. Prints the best and median of several runs, since
these machines are noisy. Run: python benchmarks/plan_render.py
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

from megatron_operator.api import load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import render


def _job(nodes: int) -> Any:
    return load_job(
        {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "metadata": {"name": "bench", "namespace": "default", "uid": "u-1"},
            "spec": {
                "image": "trainer:bench",
                "model": {"recipe": "llama3-70b"},
                "parallelism": {"tensor": 8, "pipeline": 4, "sequenceParallel": True},
                "training": {"globalBatchSize": 16 * nodes, "trainIters": 10},
                "data": {"mock": True},
                "resources": {"nodes": nodes, "procsPerNode": 8},
                "topology": {"key": "rack", "mode": "required"},
                "checkpoint": {"volume": {"claimName": "ckpt"}},
            },
        }
    )


def _time(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}"
    )

    big = _job(16384)
    p = plan(big.spec)
    assert p.world_size == 131072

    def plan_all_ranks() -> None:
        q = plan(big.spec)
        assert len(q.ranks()) == 131072

    def plan_as_json() -> None:
        assert len(plan(big.spec).to_dict()["ranks"]) == 131072

    pods = _job(1024)
    pods_plan = plan(pods.spec)

    def render_pods() -> None:
        objs = render(pods, pods_plan, attempt=1)
        assert sum(o["kind"] == "Pod" for o in objs) == 1024

    for name, fn, goal in [
        ("plan 131,072 ranks (coordinates)", plan_all_ranks, 1.0),
        ("plan 131,072 ranks (+ JSON-ready dicts)", plan_as_json, None),
        ("render 1,024 pods (+ Service, ConfigMap, RBAC)", render_pods, 1.0),
    ]:
        times = _time(fn, args.repeat)
        verdict = "" if goal is None else ("  ok" if min(times) <= goal else "  OVER GOAL")
        print(
            f"{name:48s} best {min(times):.3f} s  median {statistics.median(times):.3f} s"
            + (f"  (goal ≤ {goal:.0f} s){verdict}" if goal else "")
        )


if __name__ == "__main__":
    main()
