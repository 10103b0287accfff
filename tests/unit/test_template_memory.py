"""One job's template cannot make the operator's memory grow with its gang: the template has a
budget checked before planning, the pods of a gang are rendered one at a time as their create
calls read them, they share the template's parts instead of copying them, and the cache of
prepared templates is bounded in bytes. The apiserver's side (the CRD's caps) is in
tests/integration/test_operator_open_pods.py; the operator's RSS in
benchmarks/operator_template_memory.py."""

from __future__ import annotations

import copy
import gc
import json
import tracemalloc
from typing import Any

from megatron_operator.api import SpecError, load_job
from megatron_operator.api.template import MAX_TEMPLATE_BYTES, MAX_TEMPLATE_VALUES
from megatron_operator.core import overlay
from megatron_operator.core.kueue import PodSetAdmission, TasPod, admission_pod_patch
from megatron_operator.core.planner import plan
from megatron_operator.core.reconcile import reconcile
from megatron_operator.core.render import Pods

from .sim import Sim
from .specs import job_doc, spec_of
from .template_cases import FULL_TEMPLATE, heavy_template

BUDGET = heavy_template(MAX_TEMPLATE_VALUES, MAX_TEMPLATE_BYTES)  # the heaviest accepted
# What the CRD accepts but the budget does not: 16 sidecars of 256 env vars (12,000 values).
OVER = heavy_template(16 * (256 * 3 + 6), 200_000)


def _spec(template: dict[str, Any], nodes: int = 2) -> dict[str, Any]:
    changes = {"template": template, "resources.nodes": nodes}
    return spec_of({**changes, "training.globalBatchSize": 8 * nodes})


def _errors(template: dict[str, Any], nodes: int = 2) -> list[str]:
    try:
        load_job(job_doc(_spec(template, nodes)))
    except SpecError as exc:
        return [str(e) for e in exc.errors]
    return []


def test_the_budget_refuses_what_the_crd_accepts_naming_the_field() -> None:
    # (The real apiserver accepts OVER: tests/integration/test_operator_open_pods.py.)
    (error,) = _errors(OVER)
    assert error.startswith("spec.template: the template holds 12,")
    assert "(spec.template.spec.containers: " in error and "at most 4,096 values" in error


def test_a_template_at_the_budget_is_accepted() -> None:
    assert _errors(BUDGET) == []


def test_the_operator_refuses_it_before_planning() -> None:
    sim = Sim.of_spec(_spec(OVER, 64))
    out = sim.step()
    assert sim.status["phase"] == "Failed"
    failed = next(c for c in sim.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("spec.template: the template holds")
    assert out.create_pods == [] and sim.pods == {} and "layout" not in sim.status


def _job(template: dict[str, Any], nodes: int) -> Any:
    return load_job(job_doc(_spec(template, nodes)))


def test_pods_share_the_template_instead_of_copying_it() -> None:
    job = _job(FULL_TEMPLATE, 2)
    a, b = Pods(job, plan(job.spec), range(2), 0)
    assert a["spec"]["dnsConfig"] is b["spec"]["dnsConfig"]
    assert a["spec"]["affinity"]["nodeAffinity"] is b["spec"]["affinity"]["nodeAffinity"]
    sidecars = [[c for c in p["spec"]["containers"] if c["name"] != "trainer"] for p in (a, b)]
    assert all(x is y for x, y in zip(*sidecars, strict=True)) and sidecars[0]
    # What is merged per pod is the pod's own.
    assert a["spec"]["containers"][0] is not b["spec"]["containers"][0]
    assert a["metadata"]["labels"] is not b["metadata"]["labels"]


def _traced(fn: Any) -> tuple[Any, int, int]:
    """fn's result, the memory it leaves allocated and its peak (bytes)."""
    gc.collect()
    tracemalloc.start()
    try:
        result = fn()
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, kept, peak


def test_a_gang_is_rendered_one_pod_at_a_time() -> None:
    # 256 pods of the heaviest template: a whole pod is ~1 MB of Python objects. The reconcile
    # renders none of them (it keeps the template once); reading them one at a time, as the
    # create calls do, holds a few at a time.
    sim = Sim.of_spec(_spec(BUDGET, 256))
    small = _job(BUDGET, 1)
    first = Pods(small, plan(small.spec), [0], 0)[0]
    _, one, _ = _traced(lambda: copy.deepcopy(first))  # one pod, its own copy of everything
    out, kept, _ = _traced(lambda: reconcile(sim.world(), sim.settings))
    assert len(out.create_pods) == 256
    assert kept < 8 * one, f"the reconcile kept {kept / 1e6:.1f} MB (a pod: {one / 1e6:.1f} MB)"

    def read_all() -> int:
        return sum(len(json.dumps(p)) for p in out.create_pods)

    total, _, peak = _traced(read_all)
    assert total > 250 * len(json.dumps(first))
    assert peak < 8 * one, f"reading the gang peaked at {peak / 1e6:.1f} MB"


def test_nothing_downstream_writes_into_the_shared_template() -> None:
    job = _job(FULL_TEMPLATE, 4)
    template = job.spec.template
    assert template is not None
    doc = overlay.prepared(template)
    before = copy.deepcopy(doc)
    pods = Pods(job, plan(job.spec), range(4), 0)
    assignment = PodSetAdmission(name="trainer", flavors={"cpu": "f"}, count=4)
    flavor = {
        "spec": {"nodeLabels": {"pool": "a"}, "tolerations": [{"key": "t", "operator": "Exists"}]}
    }
    tas = TasPod(workload="wl", request={"required": "rack"})
    admitted = pods.patched(lambda o: admission_pod_patch(o, assignment, {"f": flavor}, (), tas))
    rendered = list(admitted)
    assert rendered[0]["spec"]["nodeSelector"]["pool"] == "a"
    json.dumps(rendered)
    assert doc == before
    assert overlay.prepared(template) is doc


def test_the_render_cache_is_bounded_in_bytes() -> None:
    for i in range(200):
        job = _job({"metadata": {"annotations": {"example.com/a": f"{i:03d}" * 15_000}}}, 1)
        Pods(job, plan(job.spec), [0], 0)[0]
        assert overlay.cached_bytes() <= overlay.CACHE_BYTES
    assert len(overlay._PREPARED) <= overlay.CACHE_ENTRIES


def test_template_containers_are_held_to_restricted() -> None:
    job = _job(FULL_TEMPLATE, 1)
    pod = Pods(job, plan(job.spec), [0], 0)[0]
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in [*spec["containers"], *spec["initContainers"]]:
        context = c["securityContext"]
        assert context["allowPrivilegeEscalation"] is False, c["name"]
        assert "ALL" in context["capabilities"]["drop"], c["name"]
        assert set(context["capabilities"].get("add", [])) <= {"NET_BIND_SERVICE", "IPC_LOCK"}
    exporter = next(c for c in spec["containers"] if c["name"] == "metrics-exporter")
    assert exporter["securityContext"]["capabilities"]["add"] == ["NET_BIND_SERVICE"]
