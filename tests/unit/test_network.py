"""resources.network.fabric: each fabric's devices, IPC_LOCK and env reach every pod (valid Pod
objects), spec.env wins over the fabric's env, and the conflicts are refused by `mjob validate`
and the CRD alike."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from megatron_operator.api import SpecError, load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import pod

from .celcheck import check_spec
from .specs import job_doc, spec_of


def _trainer(changes: dict[str, Any]) -> dict[str, Any]:
    job = load_job(job_doc(spec_of(changes)))
    p = pod(job, plan(job.spec), 0, 0)
    kubernetes_validate.validate(p, "1.34.0", strict=True)
    container: dict[str, Any] = p["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("network", "resource", "count", "env"),
    [
        ({"fabric": "infiniband"}, "rdma/ib", "1", {"NCCL_IB_DISABLE": "0"}),
        ({"fabric": "roce"}, "rdma/roce", "1", {"NCCL_IB_DISABLE": "0"}),
        (
            {"fabric": "efa", "devices": 32},
            "vpc.amazonaws.com/efa",
            "32",
            {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"},
        ),
        (
            {"fabric": "infiniband", "resourceName": "rdma/rdma_shared_device_a"},
            "rdma/rdma_shared_device_a",
            "1",
            {"NCCL_IB_DISABLE": "0"},
        ),
    ],
)
def test_each_fabric_reaches_the_pod(
    network: dict[str, Any], resource: str, count: str, env: dict[str, str]
) -> None:
    c = _trainer({"resources.network": network})
    assert c["resources"]["requests"][resource] == c["resources"]["limits"][resource] == count
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    values = {e["name"]: e.get("value") for e in c["env"]}
    assert {k: values.get(k) for k in env} == env


def test_no_fabric_adds_nothing() -> None:
    c = _trainer({})
    assert "add" not in c["securityContext"]["capabilities"]
    assert not any(e["name"].startswith(("NCCL_", "FI_")) for e in c["env"])


def test_spec_env_wins_over_the_fabrics() -> None:
    c = _trainer(
        {
            "resources.network": {"fabric": "efa"},
            "env": [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "0"}],
        }
    )
    rdma = [e for e in c["env"] if e["name"] == "FI_EFA_USE_DEVICE_RDMA"]
    assert rdma == [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "0"}]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (
            # With its limit (an extended resource's request needs an equal limit, a rule of its
            # own): the fabric's conflict is then named on both.
            {
                "resources.network": {"fabric": "infiniband"},
                "resources.requests": {"rdma/ib": 2},
                "resources.limits": {"rdma/ib": 2},
            },
            "spec.resources.limits spec.resources.requests",
        ),
        (
            {
                "resources.network": {"fabric": "efa"},
                "resources.limits": {"vpc.amazonaws.com/efa": 4},
            },
            "spec.resources.limits",
        ),
        ({"resources.network": {"resourceName": "rdma/ib"}}, "spec.resources.network.resourceName"),
    ],
)
def test_conflicts_are_refused_by_both(changes: dict[str, Any], field: str) -> None:
    spec = spec_of(changes)
    with pytest.raises(SpecError) as exc:
        plan(load_job(job_doc(spec)).spec)
    assert sorted(e.path for e in exc.value.errors) == sorted(field.split())
    assert sorted(v.field for v in check_spec(spec)) == sorted(field.split())
