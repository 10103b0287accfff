"""How fast the pure core is: plan 65,536 ranks (4,096 nodes × 16, the CRD's caps) and render
1,024 pods.

Goals: plan ≤ 1 s, render ≤ 1 s (with or without a spec.template). Prints the best and median of several runs, since
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

# A pod template as a platform team writes one: volumes, a native and an ordinary sidecar, a
# Secret in the trainer's env, a pull secret, scheduling and security fields.
TEMPLATE: dict[str, Any] = {
    "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"}},
    "spec": {
        "volumes": [{"name": "datasets", "persistentVolumeClaim": {"claimName": "lustre"}}],
        "initContainers": [{"name": "logs", "image": "fluent-bit:3", "restartPolicy": "Always"}],
        "containers": [
            {
                "name": "trainer",
                "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                "volumeMounts": [{"name": "datasets", "mountPath": "/datasets"}],
            },
            {"name": "exporter", "image": "dcgm-exporter:3", "ports": [{"containerPort": 9400}]},
        ],
        "imagePullSecrets": [{"name": "registry"}],
        "tolerations": [{"key": "reserved", "operator": "Exists"}],
        "securityContext": {"supplementalGroups": [4242]},
    },
}


def _job(nodes: int, template: dict[str, Any] | None = None, procs: int = 8) -> Any:
    extra = {"template": template} if template else {}
    return load_job(
        {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "metadata": {"name": "bench", "namespace": "default", "uid": "u-1"},
            "spec": {
                "image": "trainer:bench",
                "model": {"recipe": "llama3-70b"},
                "parallelism": {"tensor": 8, "pipeline": 4, "sequenceParallel": True},
                "training": {"globalBatchSize": 2 * nodes * procs, "trainIters": 10},
                "data": {"mock": True},
                "resources": {"nodes": nodes, "procsPerNode": procs},
                "topology": {"key": "rack", "mode": "required"},
                "checkpoint": {"volume": {"claimName": "ckpt"}},
                **extra,
            },
        }
    )


def _time(fn: Callable[[], object], repeat: int) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds of each run (CPU time stays meaningful on a loaded machine)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}"
    )

    big = _job(4096, procs=16)
    p = plan(big.spec)
    assert p.world_size == 65536

    def plan_all_ranks() -> None:
        q = plan(big.spec)
        assert len(q.ranks()) == 65536

    def plan_as_json() -> None:
        assert len(plan(big.spec).to_dict()["ranks"]) == 65536

    pods = _job(1024)
    pods_plan = plan(pods.spec)

    def render_pods() -> None:
        objs = render(pods, pods_plan, attempt=1)
        assert sum(o["kind"] == "Pod" for o in objs) == 1024

    templated = _job(1024, TEMPLATE)

    def render_templated() -> None:
        objs = render(templated, pods_plan, attempt=1)
        assert all(len(o["spec"]["containers"]) == 2 for o in objs if o["kind"] == "Pod")

    for name, fn, goal in [
        ("plan 65,536 ranks (coordinates)", plan_all_ranks, 1.0),
        ("plan 65,536 ranks (+ JSON-ready dicts)", plan_as_json, None),
        ("render 1,024 pods (+ Service, ConfigMap, RBAC)", render_pods, 1.0),
        ("render 1,024 pods with a pod template", render_templated, 1.0),
    ]:
        times, cpu = _time(fn, args.repeat)
        verdict = "" if goal is None else ("  ok" if min(times) <= goal else "  OVER GOAL")
        print(
            f"{name:48s} best {min(times):.3f} s  median {statistics.median(times):.3f} s  "
            f"(CPU best {min(cpu):.3f} s)" + (f"  (goal ≤ {goal:.0f} s){verdict}" if goal else "")
        )


if __name__ == "__main__":
    main()
