"""Renderer: golden YAML, Kubernetes schema validation, and the properties pods must have."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from megatron_operator.api import load_file, load_job
from megatron_operator.api.job import MegatronJob
from megatron_operator.cli.yamlio import dump_yaml
from megatron_operator.core.names import (
    LABEL_JOB_NAME,
    LABEL_NODE_RANK,
    LABEL_RESTART_ATTEMPT,
)
from megatron_operator.core.planner import plan
from megatron_operator.core.render import as_list, render

from .sim import T0
from .specs import job_doc, job_of, spec_of

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
K8S_VERSION = "1.34.0"


def _with_uid(job: MegatronJob) -> MegatronJob:
    meta = job.metadata.model_copy(update={"uid": "00000000-0000-0000-0000-000000000001"})
    return job.model_copy(update={"metadata": meta})


@pytest.mark.parametrize(
    ("example", "attempt"), [("cpu-tiny", 0), ("llama3-70b", 3), ("deepseek-v2-lite", 0)]
)
def test_render_matches_golden(example: str, attempt: int) -> None:
    job = _with_uid(load_file(ROOT / "examples" / f"{example}.yaml"))
    text = dump_yaml(as_list(render(job, plan(job.spec), attempt)))
    golden = GOLDEN / f"render-{example}-attempt{attempt}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"missing {golden}: run with UPDATE_GOLDEN=1 and review the diff"
    assert text == golden.read_text(encoding="utf-8"), (
        f"{golden.name} differs: if the change is intended, rerun with UPDATE_GOLDEN=1 and "
        "review the diff"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_object_validates_against_kubernetes_schema(path: Path) -> None:
    job = _with_uid(load_file(path))
    for obj in render(job, plan(job.spec), attempt=2):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _pods(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "Pod"]


def test_one_pod_per_node_with_deterministic_names_and_labels() -> None:
    job = _with_uid(job_of({"resources.nodes": 4}, name="big"))
    objs = render(job, plan(job.spec), attempt=5)
    pods = _pods(objs)
    assert [p["metadata"]["name"] for p in pods] == ["big-a5-0", "big-a5-1", "big-a5-2", "big-a5-3"]
    assert [p["spec"]["hostname"] for p in pods] == ["big-0", "big-1", "big-2", "big-3"]
    assert {p["spec"]["subdomain"] for p in pods} == {"big"}
    for i, p in enumerate(pods):
        labels = p["metadata"]["labels"]
        assert labels[LABEL_JOB_NAME] == "big"
        assert labels[LABEL_RESTART_ATTEMPT] == "5"
        assert labels[LABEL_NODE_RANK] == str(i)
        owner = p["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "MegatronJob" and owner["controller"] is True
        assert owner["uid"] == job.metadata.uid
    for obj in objs:
        assert obj["metadata"]["labels"][LABEL_JOB_NAME] == "big"
    assert render(job, plan(job.spec), attempt=5) == objs  # deterministic


def test_pod_env_contract_and_resources() -> None:
    job = job_of({"resources.nodes": 2, "resources.procsPerNode": 8}, name="j", namespace="ml")
    pods = _pods(render(job, plan(job.spec), attempt=1))
    env = {e["name"]: e.get("value") for e in pods[1]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "j-0.j.ml.svc"
    assert env["MASTER_PORT"] == "29500"
    assert env["WORLD_SIZE"] == "16"
    assert env["NNODES"] == "2"
    assert env["NODE_RANK"] == "1"
    assert env["NPROC_PER_NODE"] == "8"
    assert env["MEGATRON_CONFIG"] == "/etc/megatron/config.json"
    assert env["MEGATRON_RESTART_ATTEMPT"] == "1"
    c = pods[1]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "8"
    shm = next(v for v in pods[1]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pods[1]["spec"]["subdomain"] == "j"
    assert pods[1]["spec"]["hostname"] == "j-1"


def test_security_context_is_restrictive_and_rdma_adds_only_ipc_lock() -> None:
    plain = _pods(render(job_of(), plan(job_of().spec)))[0]["spec"]["containers"][0]
    assert plain["securityContext"]["allowPrivilegeEscalation"] is False
    assert plain["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    job = job_of({"resources.requests": {"rdma/ib": "1"}, "resources.limits": {"rdma/ib": "1"}})
    rdma = _pods(render(job, plan(job.spec)))[0]["spec"]["containers"][0]
    assert rdma["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_topology_modes() -> None:
    def affinity(mode: str) -> dict[str, Any]:
        job = job_of({"topology": {"key": "rack", "mode": mode}})
        return dict(_pods(render(job, plan(job.spec)))[0]["spec"]["affinity"])

    anti = affinity("none")["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert "podAffinity" not in affinity("none")
    req = affinity("required")["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert req[0]["topologyKey"] == "rack"
    pref = affinity("preferred")["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref[0]["podAffinityTerm"]["topologyKey"] == "rack"


def test_pvc_only_when_created_and_service_is_headless() -> None:
    kinds = [o["kind"] for o in render(job_of(), plan(job_of().spec))]
    assert "PersistentVolumeClaim" not in kinds
    job = job_of({"checkpoint.volume": {"create": {"size": "10Gi", "storageClassName": "fast"}}})
    objs = render(job, plan(job.spec))
    claim = next(o for o in objs if o["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "job-checkpoints"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    svc = next(o for o in objs if o["kind"] == "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_service_selects_exactly_the_pod_behind_master_addr() -> None:
    # One endpoint per job, not one per pod: a 1,024-pod gang restart then rewrites one
    # Endpoints entry instead of ~1,000 addresses across a dozen EndpointSlices.
    job = job_of({"resources.nodes": 4}, name="dns", namespace="team")
    objs = render(job, plan(job.spec), attempt=2)
    svc = next(o for o in objs if o["kind"] == "Service")
    selector = svc["spec"]["selector"]
    selected = [p for p in _pods(objs) if selector.items() <= p["metadata"]["labels"].items()]
    assert len(selected) == 1
    rank0 = selected[0]
    env = {e["name"]: e.get("value") for e in rank0["spec"]["containers"][0]["env"]}
    host, subdomain, namespace, _ = env["MASTER_ADDR"].split(".")
    assert (host, subdomain) == (rank0["spec"]["hostname"], rank0["spec"]["subdomain"])
    assert (subdomain, namespace) == (svc["metadata"]["name"], svc["metadata"]["namespace"])


def test_trainer_role_allows_writing_only_its_progress_lease_and_reading_its_job() -> None:
    job = _with_uid(job_of({"resources.nodes": 3, "training.globalBatchSize": 48}))
    objs = render(job, plan(job.spec))
    role = next(o for o in objs if o["kind"] == "Role")
    # No pod verb at all: user code cannot relabel its pod into a Service or another gang. And
    # no status write: the job is read (the coordinator watches the operator's decisions).
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["job-progress"],
            "verbs": ["get", "update", "patch"],
        },
        {
            "apiGroups": ["megatron.dev"],
            "resources": ["megatronjobs"],
            "resourceNames": ["job"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    lease = next(o for o in objs if o["kind"] == "Lease")
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    assert lease["metadata"]["name"] == "job-progress"
    owner = lease["metadata"]["ownerReferences"][0]
    assert owner["controller"] is True and owner["uid"] == job.metadata.uid
    for pod in _pods(objs):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["MEGATRON_PROGRESS_LEASE"] == "job-progress"


def test_config_map_holds_the_resolved_config() -> None:
    job = job_of({"parallelism.tensor": 2, "model.numLayers": 6})
    cm = next(o for o in render(job, plan(job.spec)) if o["kind"] == "ConfigMap")
    cfg = json.loads(cm["data"]["config.json"])
    assert cfg["kind"] == "TrainerConfig"
    assert cfg["model"]["numLayers"] == 6  # override
    assert cfg["model"]["hiddenSize"] == 128  # from the recipe
    assert cfg["parallelism"]["data"] == 8  # auto resolved
    assert cfg["training"]["precision"] == "bf16"  # GPU default
    assert cfg["checkpoint"]["dir"] == "/mnt/checkpoints/job"


@pytest.mark.parametrize(
    ("requests", "limits", "ipc_lock"),
    [
        # An extended resource's request needs an equal limit (the apiserver's rule).
        ({"rdma/ib": 1}, {"rdma/ib": 1}, True),
        ({}, {"rdma/ib": "1"}, True),
        ({"rdma/ib": 0}, {"rdma/ib": 0}, False),
        ({}, {"rdma/x": "0m"}, False),
        ({"cpu": "8"}, {}, False),
    ],
)
def test_ipc_lock_only_for_a_positive_rdma_request(
    requests: dict[str, Any], limits: dict[str, Any], ipc_lock: bool
) -> None:
    job = job_of({"resources.requests": requests, "resources.limits": limits})
    pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
    caps = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert ("IPC_LOCK" in caps.get("add", [])) == ipc_lock
    assert pod["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


@pytest.mark.parametrize(("policy", "owned"), [(None, False), ("Retain", False), ("Delete", True)])
def test_created_claim_is_retained_unless_the_spec_says_delete(
    policy: str | None, owned: bool
) -> None:
    create: dict[str, Any] = {"size": "10Gi"}
    if policy is not None:
        create["retentionPolicy"] = {"whenDeleted": policy}
    job = _with_uid(job_of({"checkpoint.volume": {"create": create}}, name="keep"))
    claim = next(o for o in render(job, plan(job.spec)) if o["kind"] == "PersistentVolumeClaim")
    meta = claim["metadata"]
    assert ("ownerReferences" in meta) is owned
    # labelled with the job's name and uid either way: a re-created job of this name reuses it
    assert meta["labels"]["megatron.dev/job-name"] == "keep"
    assert meta["labels"]["megatron.dev/job-uid"] == job.metadata.uid
    kubernetes_validate.validate(claim, K8S_VERSION, strict=True)


def test_network_policy_admits_only_the_jobs_own_pods() -> None:
    job = _with_uid(job_of({}, name="iso"))
    assert not [o for o in render(job, plan(job.spec)) if o["kind"] == "NetworkPolicy"]
    objs = render(job, plan(job.spec), isolate=True)
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    selector = {"matchLabels": {LABEL_JOB_NAME: "iso"}}
    assert policy["spec"]["podSelector"] == selector
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": selector}]}]
    assert policy["metadata"]["ownerReferences"][0]["controller"] is True
    # every pod carries the label the policy selects
    for pod in _pods(objs):
        assert pod["metadata"]["labels"][LABEL_JOB_NAME] == "iso"


def test_master_addr_is_the_stable_hostname_of_rank_0() -> None:
    job = _with_uid(job_of({"resources.nodes": 2}, name="dns", namespace="team"))
    for attempt in (0, 7):
        pods = _pods(render(job, plan(job.spec), attempt))
        env = {e["name"]: e.get("value") for e in pods[1]["spec"]["containers"][0]["env"]}
        assert env["MASTER_ADDR"] == "dns-0.dns.team.svc"
        assert pods[0]["spec"]["hostname"] == "dns-0" and pods[0]["spec"]["subdomain"] == "dns"


def test_the_config_map_records_env_values_as_digests() -> None:
    """spec.json in the ConfigMap is readable with the namespace's `view` role: a token in
    spec.env must not be in it (the pod's env still carries it; valueFrom keeps it out of both)."""
    from megatron_operator.core.reconcile import World, reconcile
    from megatron_operator.core.render import recorded_spec

    doc = job_doc(spec_of({"env": [{"name": "HF_TOKEN", "value": "hf_secret_value"}]}), name="j")
    job = load_job(doc)
    cm = next(o for o in render(job, plan(job.spec), 0) if o["kind"] == "ConfigMap")
    text = json.dumps(cm["data"])
    assert "hf_secret_value" not in text and "HF_TOKEN" in text
    # The record still tells a changed value from the same one (transitions while running).
    recorded = json.loads(cm["data"]["spec.json"])
    same = World(
        job={**doc, "status": {"phase": "Running"}}, pods=[], now=T0, accepted_spec=recorded
    )
    assert reconcile(same).status["phase"] != "Failed"
    changed = json.loads(json.dumps(doc))
    changed["spec"]["env"][0]["value"] = "other"
    out = reconcile(
        World(
            job={**changed, "status": {"phase": "Running"}}, pods=[], now=T0, accepted_spec=recorded
        )
    )
    assert out.status["phase"] == "Failed" and "env" in json.dumps(out.status["conditions"])
    assert recorded_spec(job.spec).env[0].value.startswith("sha256:")
