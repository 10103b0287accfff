"""spec.template: what the operator owns is refused by `mjob validate` and by the CRD's CEL alike
(each refused case through both), and what a template may set reaches the pods, merged by name.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from megatron_operator.api import SpecError, load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import pod

from .celcheck import check_spec
from .specs import job_doc, spec_of
from .template_cases import FULL_TEMPLATE, REFUSED, Refused

K8S_VERSION = "1.34.0"


def _mjob_errors(spec: dict[str, Any]) -> list[str]:
    try:
        load_job(job_doc(spec))
    except SpecError as exc:
        return [str(e) for e in exc.errors]
    return []


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_mjob_validate_and_the_crd_refuse_it_by_name(case: Refused) -> None:
    ours = _mjob_errors(case.spec())
    assert any(e.startswith(case.field) and case.why in e for e in ours), ours
    cel = check_spec(case.spec())
    assert any(v.field.startswith(case.field) and case.why in v.message for v in cel), cel


def test_the_full_template_passes_both() -> None:
    spec = spec_of({"template": FULL_TEMPLATE})
    assert _mjob_errors(spec) == []
    assert check_spec(spec) == []


def _pod(template: dict[str, Any], changes: dict[str, Any] | None = None) -> dict[str, Any]:
    job = load_job(job_doc(spec_of({"template": template, **(changes or {})})))
    return pod(job, plan(job.spec), 0, 0)


def test_each_part_of_the_template_reaches_the_pod() -> None:
    p = _pod(FULL_TEMPLATE, {"data.volume.claimName": "corpus"})
    kubernetes_validate.validate(p, K8S_VERSION, strict=True)
    meta, spec = p["metadata"], p["spec"]
    assert meta["labels"]["team"] == "pretraining"
    assert meta["labels"]["megatron.dev/job-name"] == "job"  # ours kept beside theirs
    assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-sriov"
    assert "megatron.dev/layout" in meta["annotations"]
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert {"config", "checkpoints", "dshm", "megatron-data", "datasets", "scratch"} <= set(volumes)
    assert volumes["megatron-data"]["persistentVolumeClaim"] == {
        "claimName": "corpus",
        "readOnly": True,
    }
    trainer, *sidecars = spec["containers"]
    assert trainer["name"] == "trainer" and trainer["command"] == [
        "python",
        "-m",
        "megatron_trainer",
    ]
    env = {e["name"]: e for e in trainer["env"]}
    assert env["WANDB_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "wandb", "key": "api-key"}
    }
    assert env["MEGATRON_DATA_DIR"]["value"] == "/mnt/data"
    assert "WORLD_SIZE" in env
    assert trainer["envFrom"] == [{"configMapRef": {"name": "team-settings"}}]
    mounts = {m["mountPath"]: m for m in trainer["volumeMounts"]}
    assert {
        "/etc/megatron",
        "/mnt/checkpoints",
        "/dev/shm",
        "/mnt/data",
        "/datasets",
        "/scratch",
    } <= set(mounts)
    assert mounts["/mnt/data"]["readOnly"] is True
    assert trainer["resources"]["requests"]["hugepages-2Mi"] == "1Gi"
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"  # the GPU count stays ours
    assert [c["name"] for c in sidecars] == ["metrics-exporter"]
    assert [c["name"] for c in spec["initContainers"]] == ["log-shipper"]
    assert spec["nodeSelector"] == {"example.com/pool": "h100"}
    assert spec["tolerations"] == [{"key": "example.com/reserved", "operator": "Exists"}]
    assert spec["affinity"]["nodeAffinity"] == FULL_TEMPLATE["spec"]["affinity"]["nodeAffinity"]
    assert "podAntiAffinity" in spec["affinity"]  # one pod per node still holds
    assert spec["runtimeClassName"] == "nvidia" and spec["schedulerName"] == "default-scheduler"
    assert spec["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}
    assert spec["securityContext"]["supplementalGroups"] == [4242]
    assert spec["securityContext"]["runAsNonRoot"] is True  # merged key by key over ours
    # The pod the gang depends on is unchanged.
    assert spec["restartPolicy"] == "Never" and spec["hostname"] == "job-0"
    assert spec["serviceAccountName"] == "job-trainer"


def test_lists_merge_by_name_and_terms_add_to_ours() -> None:
    template = {
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                    "resources": {"requests": {"cpu": "8"}},
                }
            ],
            "nodeSelector": {"a": "template"},
            "tolerations": [{"key": "t", "operator": "Exists"}],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 10,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": {"app": "noisy"}},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }
                    ]
                }
            },
        }
    }
    changes = {
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "resources.requests": {"cpu": "4", "memory": "8Gi"},
        "resources.nodeSelector": {"a": "spec", "b": "spec"},
        "resources.tolerations": [{"key": "g", "operator": "Exists"}],
        "topology.key": "rack",
        "topology.mode": "required",
    }
    p = _pod(template, changes)
    kubernetes_validate.validate(p, K8S_VERSION, strict=True)
    trainer = p["spec"]["containers"][0]
    debug = [e for e in trainer["env"] if e["name"] == "NCCL_DEBUG"]
    assert debug == [{"name": "NCCL_DEBUG", "value": "INFO"}]  # replaced by name, not doubled
    assert trainer["resources"]["requests"] == {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "8"}
    assert p["spec"]["nodeSelector"] == {"a": "template", "b": "spec"}
    assert [t["key"] for t in p["spec"]["tolerations"]] == ["g", "t"]
    anti = p["spec"]["affinity"]["podAntiAffinity"]
    assert anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    assert len(anti["preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    assert p["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_the_template_does_not_change_the_job_spec_it_came_from() -> None:
    template = copy.deepcopy(FULL_TEMPLATE)
    job = load_job(job_doc(spec_of({"template": template})))
    before = job.spec.to_api()
    pod(job, plan(job.spec), 0, 0)
    pod(job, plan(job.spec), 1, 0)
    assert job.spec.to_api() == before


def test_without_a_template_the_pod_is_the_operators_alone() -> None:
    job = load_job(job_doc(spec_of()))
    p = pod(job, plan(job.spec), 0, 0)
    assert "imagePullSecrets" not in p["spec"] and "initContainers" not in p["spec"]
    assert [c["name"] for c in p["spec"]["containers"]] == ["trainer"]
