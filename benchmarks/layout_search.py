"""How long `mjob plan --suggest` / parallelism.auto takes to search every layout of a spec.

The operator plans a job at every reconcile; an auto job pays the search once per spec (the
planner caches it). Goal: a few seconds at most for the examples' models up to 1,024 nodes of 8
GPUs, so a reconcile worker is not held long. Prints, per case, the valid layouts found, the best and the
median of several cold searches. Run: python benchmarks/layout_search.py
"""

from __future__ import annotations

import platform
import statistics
import time

from megatron_operator.api import MegatronJobSpec
from megatron_operator.core import planner

CASES = [  # (recipe, nodes, global batch)
    ("llama3-8b", 1, 128),
    ("llama3-70b", 8, 512),
    ("mixtral-8x7b", 8, 512),
    ("deepseek-v2-lite", 2, 64),
    ("llama3-70b", 1024, 8192),
    ("mixtral-8x7b", 1024, 8192),
]


def spec(recipe: str, nodes: int, gbs: int) -> MegatronJobSpec:
    return MegatronJobSpec.model_validate(
        {
            "image": "trainer:bench",
            "model": {"recipe": recipe},
            "parallelism": {"auto": True},
            "training": {"globalBatchSize": gbs, "trainIters": 1000},
            "data": {"mock": True},
            "resources": {"nodes": nodes, "procsPerNode": 8},
            "checkpoint": {"volume": {"claimName": "c"}, "shardingType": "fully_reshardable"},
        }
    )


def main() -> None:
    print(f"layout search, {platform.node()}, python {platform.python_version()}")
    for recipe, nodes, gbs in CASES:
        times = []
        for _ in range(3):
            planner._SUGGESTION_CACHE.clear()  # a cold search each time
            start = time.perf_counter()
            found = planner.suggestions(spec(recipe, nodes, gbs))
            times.append(time.perf_counter() - start)
        print(
            f"{recipe:>17} × {nodes:>4} nodes: {len(found):>5} layouts, best "
            f"{min(times):.2f} s, median {statistics.median(times):.2f} s, first "
            f"{found[0].plan.layout_string()}"
        )


if __name__ == "__main__":
    main()
