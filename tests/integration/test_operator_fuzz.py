"""2,000+ random specs applied with the CRD's validation bypassed (issue 6 acceptance 9).

The CRD is swapped for a permissive one (spec: any object) for the duration; every job must end
either valid (the operator runs it) or Failed with reason InvalidSpec, and no handler may raise.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_operator.api import SpecError, load_job
from megatron_operator.api.crd import crd
from megatron_operator.core.planner import plan

from .conftest import Cluster
from .operator_support import Op, install_crd, tiny_gpu_job

N_SPECS = 2000
CR = ("megatron.dev", "v1alpha1")
PLURAL = "megatronjobs"


def permissive_crd() -> dict[str, Any]:
    out = copy.deepcopy(crd())
    version = out["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    schema.pop("x-kubernetes-validations", None)
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"]["status"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    return out


@pytest.fixture
def bypassed(cluster: Cluster) -> Iterator[None]:
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(permissive_crd())
    )
    try:
        yield
    finally:
        install_crd(cluster)


_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70000),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from(
        [
            "auto",
            "",
            "x",
            "bf16",
            "none",
            "gpt-tiny",
            "llama3-8b",
            "nvidia.com/gpu",
            "1Gi",
            "required",
        ]
    ),
)
_JSON = st.recursive(
    _LEAF,
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.dictionaries(
            st.sampled_from(["a", "tensor", "nodes", "mock", "recipe", "size"]), c, max_size=3
        ),
    ),
    max_leaves=6,
)
PATHS = [
    "model.recipe",
    "model.numLayers",
    "model.numAttentionHeads",
    "model.moe",
    "parallelism.tensor",
    "parallelism.pipeline",
    "parallelism.virtualPipeline",
    "parallelism.data",
    "parallelism.expert",
    "parallelism.sequenceParallel",
    "training.globalBatchSize",
    "training.precision",
    "training.lr",
    "data",
    "data.mock",
    "resources.nodes",
    "resources.procsPerNode",
    "resources.accelerator",
    "resources.requests",
    "topology",
    "checkpoint.volume",
    "checkpoint.keep",
    "restartPolicy.rules",
    "suspend",
    "image",
    "env",
    "bogus",
]


def _mutate(spec: dict[str, Any], path: str, value: Any) -> None:
    node = spec
    parts = path.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _expected_valid(doc: dict[str, Any]) -> bool:
    try:
        plan(load_job(doc).spec)
    except SpecError:
        return False
    return True


def test_random_specs_end_valid_or_invalidspec(
    cluster: Cluster, namespace: str, bypassed: None, tmp_path_factory: pytest.TempPathFactory
) -> None:
    docs: list[dict[str, Any]] = []

    @settings(
        max_examples=N_SPECS, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        changes=st.lists(st.tuples(st.sampled_from(PATHS), _JSON), max_size=3),
        layout=st.fixed_dictionaries(
            {
                "parallelism.tensor": st.sampled_from([1, 2, 3, 4, 8, 16]),
                "parallelism.pipeline": st.sampled_from([1, 2, 3, 4]),
                "resources.nodes": st.integers(1, 3),
                "training.globalBatchSize": st.sampled_from([8, 12, 16, 48, 64]),
                "model.recipe": st.sampled_from(["gpt-tiny", "llama3-8b", "mixtral-8x7b"]),
            }
        ),
        mode=st.sampled_from(["junk", "junk", "whole", "layout"]),
    )
    def collect(changes: list[tuple[str, Any]], layout: dict[str, Any], mode: str) -> None:
        doc = tiny_gpu_job(f"fz{len(docs)}", nodes=1)
        doc["spec"]["checkpoint"]["volume"] = {"claimName": "unused"}
        if mode == "layout":  # plausible layouts: a mix the planner accepts and rejects
            for path, value in layout.items():
                _mutate(doc["spec"], path, value)
        elif mode == "whole" and changes:
            doc["spec"] = changes[0][1] if isinstance(changes[0][1], dict) else {"x": changes[0][1]}
        else:
            for path, value in changes:
                _mutate(doc["spec"], path, value)
        docs.append(doc)

    collect()
    assert len(docs) >= N_SPECS
    random.Random(7).shuffle(docs)

    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    op = Op(cluster, tmp_path_factory.mktemp("fuzz"))
    op.start()
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(16) as pool:  # kubectl apply sends them one at a time
            list(
                pool.map(
                    lambda d: custom.create_namespaced_custom_object(*CR, namespace, PLURAL, d),
                    docs,
                )
            )

        def settled() -> list[dict[str, Any]] | None:
            items: list[dict[str, Any]] = cluster.kubectl_json("get", "mj", "-n", namespace)[
                "items"
            ]
            done = len(items) == len(docs) and all(j.get("status", {}).get("phase") for j in items)
            return items if done else None

        items: list[dict[str, Any]] = cluster.wait(
            settled, 600, interval=3, what="every job has a phase"
        )
        verdicts = {"valid": 0, "invalid": 0}
        wrong = []
        for item in items:
            # Judge what the apiserver stored (apply drops nulls, for one): what the operator saw.
            stored = {k: item[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in item}
            valid = _expected_valid(stored)
            verdicts["valid" if valid else "invalid"] += 1
            st_ = item.get("status", {})
            failed_invalid = st_.get("phase") == "Failed" and any(
                c.get("type") == "Failed" and c.get("reason") == "InvalidSpec"
                for c in st_.get("conditions", [])
            )
            if valid == failed_invalid:
                wrong.append((item["metadata"]["name"], valid, st_.get("phase"), item["spec"]))
        assert not wrong, f"{len(wrong)} jobs ended wrong, e.g. {wrong[:3]}"
        assert verdicts["valid"] > 0 and verdicts["invalid"] > 0, verdicts
        print(f"fuzz: {len(items)} jobs {verdicts}, settled in {time.monotonic() - t0:.0f}s")
        logs = op.logs()
        assert "Traceback" not in logs, logs[-3000:]
        assert "failed with an exception" not in logs, logs[-3000:]
    finally:
        try:
            # Delete while the operator runs, so its finalizer is removed and nothing lingers.
            start = time.monotonic()
            _delete_all(custom, namespace)
            cluster.wait(
                lambda: (
                    not custom.list_namespaced_custom_object(*CR, namespace, PLURAL, limit=1)[
                        "items"
                    ]
                ),
                600,
                interval=2,
                what="every fuzz job deleted",
            )
            print(f"deleted {len(docs)} fuzz jobs in {time.monotonic() - start:.1f}s")
        finally:
            op.stop()  # even when the cleanup fails: a running operator would outlive the test


def _delete_all(custom: Any, namespace: str) -> None:
    """DELETE the collection. On a loaded machine the apiserver may answer 504 (its 60 s request
    timeout) while it still deletes: the call is idempotent, so it is made again."""
    for tries_left in range(3, 0, -1):
        try:
            custom.delete_collection_namespaced_custom_object(*CR, namespace, PLURAL)
            return
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status not in (500, 503, 504) or tries_left == 1:
                raise
