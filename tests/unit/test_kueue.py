"""Kueue's external-controller protocol as data (core/kueue.py): table tests.

Workloads read back are built here as the raw JSON Kueue v0.19 writes (field names from its
v1beta2 API); tests/integration/test_kueue_protocol.py checks the same functions against the real
Kueue controller.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import kubernetes_validate
import pytest

from megatron_operator.api import load_file, load_job
from megatron_operator.api.job import MegatronJob
from megatron_operator.core import kueue
from megatron_operator.core.kueue import (
    KueueError,
    PodSetAdmission,
    PodsReadyReason,
    TasPod,
    WorkloadPhase,
)
from megatron_operator.core.names import LABEL_NODE_RANK, LABEL_RESTART_ATTEMPT
from megatron_operator.core.planner import plan
from megatron_operator.core.render import pods

from .specs import spec_of
from .test_render import ROOT

UID = "5f0c6a52-6a1e-4d1c-9c55-0123456789ab"
NOW = datetime(2026, 11, 23, 15, 0, 0, tzinfo=UTC)
EARLIER = "2026-11-23T14:00:00Z"
K8S_VERSION = "1.34.0"


def queued_job(
    changes: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    name: str = "job",
    uid: str | None = UID,
) -> MegatronJob:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a"}
    meta["labels"] = {kueue.LABEL_QUEUE_NAME: "gpus", **(labels or {})}
    if uid is not None:
        meta["uid"] = uid
    return load_job(
        {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "metadata": meta,
            "spec": spec_of(changes),
        }
    )


def cond(type_: str, status: str, reason: str, message: str = "", time: str = EARLIER) -> Any:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": time,
        "observedGeneration": 1,
    }


ADMISSION: dict[str, Any] = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {
            "name": "trainer",
            "count": 2,
            "flavors": {"nvidia.com/gpu": "h100", "cpu": "default"},
            "resourceUsage": {"nvidia.com/gpu": "16"},
        }
    ],
}


def workload(
    *conditions: Any,
    admission: Any = None,
    active: bool | None = None,
    checks: Any = None,
    topology: Any = None,
) -> dict[str, Any]:
    podset: dict[str, Any] = {"name": "trainer", "count": 2, "template": {"spec": {}}}
    if topology is not None:
        podset["topologyRequest"] = topology
    raw: dict[str, Any] = {
        "apiVersion": kueue.API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": "job-abcde",
            "namespace": "team-a",
            "resourceVersion": "4711",
            "generation": 1,
        },
        "spec": {"queueName": "gpus", "podSets": [podset]},
        "status": {"conditions": list(conditions)},
    }
    if active is not None:
        raw["spec"]["active"] = active
    if admission is not None:
        raw["status"]["admission"] = admission
    if checks is not None:
        raw["status"]["admissionChecks"] = checks
    return raw


RESERVED = cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq")
ADMITTED = cond("Admitted", "True", "Admitted", "The workload is admitted")
PREEMPTED = cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x)")


# -- names and the Workload -------------------------------------------------------------------


def test_workload_name_is_short_stable_and_tied_to_the_uid() -> None:
    name = kueue.workload_name("llama", UID)
    assert name.startswith("llama-") and len(name) == len("llama-") + 5
    assert name == kueue.workload_name("llama", UID)
    assert name != kueue.workload_name("llama", UID.replace("5", "6"))
    longest = kueue.workload_name("a" * 50, UID)
    assert len(longest) <= 63
    assert len(kueue.workload_name("b" * 80, UID)) == 63


def test_workload_name_needs_a_uid() -> None:
    with pytest.raises(KueueError, match=r"metadata\.uid"):
        kueue.workload_name("job", "")


def test_render_workload_owner_labels_queue_and_one_podset_per_role() -> None:
    job = queued_job()
    wl = kueue.render_workload(job, plan(job.spec))
    assert (wl["apiVersion"], wl["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
    meta = wl["metadata"]
    assert meta["name"] == kueue.workload_name("job", UID)
    assert meta["namespace"] == "team-a"
    assert meta["labels"][kueue.LABEL_JOB_UID] == UID
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "name": "job",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = wl["spec"]
    assert spec["queueName"] == "gpus"
    assert [(ps["name"], ps["count"]) for ps in spec["podSets"]] == [("trainer", 2)]
    # Unset: Kueue defaults it to true; setting it would undo a user's deactivation on update.
    assert "active" not in spec and "minCount" not in spec["podSets"][0]
    assert "priorityClassRef" not in spec and "priority" not in spec


@pytest.mark.parametrize(
    ("source", "changes"),
    [
        ("gpu", {}),
        ("gpu", {"resources.requests": {"cpu": "90", "memory": "1200Gi"}}),
        ("gpu", {"resources.requests": {"cpu": "8"}, "resources.limits": {"memory": "64Gi"}}),
        ("cpu-tiny", {}),
        ("llama3-70b", {}),
    ],
)
def test_template_requests_are_exactly_the_pods_requests(
    source: str, changes: dict[str, Any]
) -> None:
    if source == "gpu":
        job = queued_job(changes)
    else:
        loaded = load_file(ROOT / "examples" / f"{source}.yaml")
        meta = loaded.metadata.model_copy(
            update={"uid": UID, "labels": {kueue.LABEL_QUEUE_NAME: "q"}}
        )
        job = loaded.model_copy(update={"metadata": meta})
    p = plan(job.spec)
    template = kueue.render_workload(job, p)["spec"]["podSets"][0]["template"]
    want = [c["resources"] for c in template["spec"]["containers"]]
    for rendered in pods(job, p, attempt=3):
        assert [c["resources"] for c in rendered["spec"]["containers"]] == want
        assert rendered["spec"].get("initContainers") == template["spec"].get("initContainers")


def test_template_metadata_has_only_labels_and_annotations_common_to_all_pods() -> None:
    job = queued_job()
    template = kueue.render_workload(job, plan(job.spec))["spec"]["podSets"][0]["template"]
    assert set(template["metadata"]) == {"labels", "annotations"}
    assert LABEL_NODE_RANK not in template["metadata"]["labels"]
    assert LABEL_RESTART_ATTEMPT not in template["metadata"]["labels"]
    # The template is a valid pod spec (Kueue's CRD holds a full PodTemplateSpec).
    kubernetes_validate.validate(
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "t"},
            "template": template,
        },
        K8S_VERSION,
        strict=True,
    )


def test_render_workload_needs_the_queue_label_and_a_uid() -> None:
    no_queue = load_job(
        {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJob",
            "metadata": {"name": "job", "uid": UID},
            "spec": spec_of(),
        }
    )
    assert kueue.queue_name(no_queue) is None
    with pytest.raises(KueueError, match=r"kueue\.x-k8s\.io/queue-name"):
        kueue.render_workload(no_queue, plan(no_queue.spec))
    no_uid = queued_job(uid=None)
    with pytest.raises(KueueError, match=r"metadata\.uid"):
        kueue.render_workload(no_uid, plan(no_uid.spec))


@pytest.mark.parametrize(
    ("changes", "labels", "priority", "want_ref"),
    [
        ({}, {}, None, None),
        ({}, {}, 7, None),  # a value without a class is ignored: nothing to reference
        (
            {"priorityClassName": "high"},
            {},
            1000,
            {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "high"},
        ),
        (
            {"priorityClassName": "high"},
            {kueue.LABEL_PRIORITY_CLASS: "urgent"},
            5000,
            {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"},
        ),
    ],
)
def test_priority_comes_from_the_jobs_priority_class(
    changes: dict[str, Any],
    labels: dict[str, str],
    priority: int | None,
    want_ref: dict[str, str] | None,
) -> None:
    job = queued_job(changes, labels)
    assert kueue.priority_class_ref(job) == want_ref
    spec = kueue.render_workload(job, plan(job.spec), priority=priority)["spec"]
    assert spec.get("priorityClassRef") == want_ref
    assert spec.get("priority") == (priority if want_ref else None)


def test_a_priority_class_without_its_value_is_refused() -> None:
    job = queued_job({"priorityClassName": "high"})
    with pytest.raises(KueueError, match="PriorityClass high"):
        kueue.render_workload(job, plan(job.spec))


@pytest.mark.parametrize(
    ("topology", "want"),
    [
        (None, None),
        ({"mode": "none", "key": "rack"}, None),
        (
            {"mode": "required", "key": "topology.megatron.dev/rack"},
            {"required": "topology.megatron.dev/rack", "podIndexLabel": LABEL_NODE_RANK},
        ),
        (
            {"mode": "preferred", "key": "nvidia.com/gpu.clique"},
            {"preferred": "nvidia.com/gpu.clique", "podIndexLabel": LABEL_NODE_RANK},
        ),
    ],
)
def test_topology_request_from_spec_topology(
    topology: dict[str, str] | None, want: dict[str, str] | None
) -> None:
    job = queued_job({"topology": topology} if topology else {})
    podset = kueue.render_workload(job, plan(job.spec))["spec"]["podSets"][0]
    assert podset.get("topologyRequest") == want


# -- reading a Workload -----------------------------------------------------------------------

PENDING_MESSAGE = (
    "couldn't assign flavors to pod set trainer: insufficient unused quota for "
    "nvidia.com/gpu in flavor h100, 16 more needed"
)


@pytest.mark.parametrize(
    ("raw", "phase", "reason", "message"),
    [
        (workload(), WorkloadPhase.PENDING, "", ""),
        (
            workload(cond("QuotaReserved", "False", "Pending", PENDING_MESSAGE)),
            WorkloadPhase.PENDING,
            "Pending",
            PENDING_MESSAGE,
        ),
        (
            workload(
                cond("QuotaReserved", "False", "Inadmissible", "LocalQueue gpus doesn't exist")
            ),
            WorkloadPhase.PENDING,
            "Inadmissible",
            "LocalQueue gpus doesn't exist",
        ),
        (
            workload(RESERVED, admission=ADMISSION),
            WorkloadPhase.RESERVED,
            "QuotaReserved",
            "Quota reserved in ClusterQueue cq",
        ),
        (
            workload(RESERVED, ADMITTED, admission=ADMISSION),
            WorkloadPhase.ADMITTED,
            "Admitted",
            "The workload is admitted",
        ),
        (
            workload(RESERVED, ADMITTED, PREEMPTED, admission=ADMISSION),
            WorkloadPhase.EVICTED,
            "Preempted",
            PREEMPTED["message"],
        ),
        (
            # Evicted and already released (our reset ran): just waiting again.
            workload(
                cond("QuotaReserved", "False", "Pending", "Preempted to accommodate"),
                cond("Admitted", "False", "NoReservation"),
                PREEMPTED,
            ),
            WorkloadPhase.PENDING,
            "Pending",
            "Preempted to accommodate",
        ),
        (
            workload(
                RESERVED,
                ADMITTED,
                cond("Finished", "True", "Succeeded", "done"),
                admission=ADMISSION,
            ),
            WorkloadPhase.FINISHED,
            "Succeeded",
            "done",
        ),
    ],
    ids=[
        "new",
        "pending",
        "inadmissible",
        "reserved",
        "admitted",
        "evicted",
        "evicted-released",
        "finished",
    ],
)
def test_workload_state(raw: Any, phase: WorkloadPhase, reason: str, message: str) -> None:
    state = kueue.workload_state(raw)
    assert (state.phase, state.reason, state.message) == (phase, reason, message)


def test_admitted_state_has_the_cluster_queue_and_flavors() -> None:
    state = kueue.workload_state(workload(RESERVED, ADMITTED, admission=ADMISSION))
    assert state.cluster_queue == "cq"
    assert state.flavors == ("default", "h100")
    assert state.assignment("trainer") == PodSetAdmission(
        name="trainer", count=2, flavors={"nvidia.com/gpu": "h100", "cpu": "default"}
    )
    assert state.tas_for("trainer") is None
    with pytest.raises(KueueError, match="podSet 'launcher'"):
        state.assignment("launcher")


def test_deactivated_workload_is_not_active() -> None:
    assert kueue.workload_state(workload(active=False)).active is False
    assert kueue.workload_state(workload(active=True)).active is True
    assert kueue.workload_state(workload()).active is True


def test_state_collects_podset_updates_and_tas() -> None:
    update = {"name": "trainer", "labels": {"a": "1"}}
    other = {"name": "launcher", "labels": {"b": "2"}}
    admission = copy.deepcopy(ADMISSION)
    admission["podSetAssignments"][0]["topologyAssignment"] = {
        "levels": ["topology.megatron.dev/rack"],
        "slices": [
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": "rack-01"}],
                "podCounts": {"universal": 2},
            }
        ],
    }
    raw = workload(
        RESERVED,
        ADMITTED,
        admission=admission,
        checks=[{"name": "prov", "state": "Ready", "podSetUpdates": [update, other]}],
        topology={"required": "topology.megatron.dev/rack", "podIndexLabel": LABEL_NODE_RANK},
    )
    state = kueue.workload_state(raw)
    assert state.updates_for("trainer") == (update,)
    assert state.tas_for("trainer") == TasPod(
        workload="job-abcde",
        request={"required": "topology.megatron.dev/rack", "podIndexLabel": LABEL_NODE_RANK},
    )


# -- pods of an admitted Workload -------------------------------------------------------------

FLAVORS: dict[str, Any] = {
    "h100": {
        "metadata": {"name": "h100"},
        "spec": {
            "nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "train"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
    },
    "default": {"metadata": {"name": "default"}, "spec": {}},
}
ASSIGNMENT = PodSetAdmission("trainer", 2, {"nvidia.com/gpu": "h100", "cpu": "default"})


def rendered_pod(changes: dict[str, Any] | None = None, rank: int = 1) -> dict[str, Any]:
    job = queued_job(changes)
    return pods(job, plan(job.spec), attempt=0)[rank]


def test_flavor_node_labels_and_tolerations_land_on_the_pod() -> None:
    original = rendered_pod(
        {
            "resources.nodeSelector": {"pool": "train"},
            "resources.tolerations": [{"key": "dedicated", "operator": "Exists"}],
        }
    )
    before = copy.deepcopy(original)
    out = kueue.admission_pod_patch(original, ASSIGNMENT, FLAVORS)
    assert original == before, "the input pod must not be changed"
    assert out["spec"]["nodeSelector"] == {
        "pool": "train",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    assert out["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert out["metadata"]["labels"][kueue.LABEL_PODSET] == "trainer"
    assert "schedulingGates" not in out["spec"]
    # Everything else is the rendered pod as it was.
    for key in ("containers", "affinity", "volumes", "hostname"):
        assert out["spec"][key] == original["spec"][key]
    kubernetes_validate.validate(out, K8S_VERSION, strict=True)


def test_merging_twice_adds_nothing() -> None:
    once = kueue.admission_pod_patch(rendered_pod(), ASSIGNMENT, FLAVORS)
    assert kueue.admission_pod_patch(once, ASSIGNMENT, FLAVORS) == once


def test_flavor_without_node_labels_leaves_no_empty_fields() -> None:
    out = kueue.admission_pod_patch(
        rendered_pod(), PodSetAdmission("trainer", 2, {"cpu": "default"}), FLAVORS
    )
    assert "nodeSelector" not in out["spec"] and "tolerations" not in out["spec"]
    kubernetes_validate.validate(out, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("assignment", "changes", "match"),
    [
        (PodSetAdmission("trainer", 2, {"nvidia.com/gpu": "a100"}), {}, "ResourceFlavor a100"),
        (ASSIGNMENT, {"resources.nodeSelector": {"pool": "infer"}}, "pool='train' conflicts"),
    ],
    ids=["missing-flavor", "node-label-conflict"],
)
def test_admission_pod_patch_errors(
    assignment: PodSetAdmission, changes: dict[str, Any], match: str
) -> None:
    with pytest.raises(KueueError, match=match):
        kueue.admission_pod_patch(rendered_pod(changes), assignment, FLAVORS)


def test_podset_updates_of_this_podset_are_merged() -> None:
    updates: list[dict[str, Any]] = [
        {
            "name": "trainer",
            "labels": {"checked": "yes"},
            "annotations": {"prov/request": "r1"},
            "nodeSelector": {"cloud/zone": "z1"},
            "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        },
        {"name": "other", "labels": {"not": "mine"}, "nodeSelector": {"x": "y"}},
    ]
    out = kueue.admission_pod_patch(rendered_pod(), ASSIGNMENT, FLAVORS, updates)
    assert out["metadata"]["labels"]["checked"] == "yes"
    assert "not" not in out["metadata"]["labels"]
    assert out["metadata"]["annotations"]["prov/request"] == "r1"
    assert out["spec"]["nodeSelector"]["cloud/zone"] == "z1"
    assert "x" not in out["spec"]["nodeSelector"]
    assert {"key": "spot", "operator": "Exists", "effect": "NoSchedule"} in out["spec"][
        "tolerations"
    ]
    with pytest.raises(KueueError, match="podSetUpdate nodeSelector"):
        kueue.admission_pod_patch(
            rendered_pod(),
            ASSIGNMENT,
            FLAVORS,
            [{"name": "trainer", "nodeSelector": {"pool": "other"}}],
        )


@pytest.mark.parametrize(
    ("request_", "annotation", "value"),
    [
        (
            {"required": "rack", "podIndexLabel": LABEL_NODE_RANK},
            kueue.ANNOTATION_REQUIRED_TOPOLOGY,
            "rack",
        ),
        (
            {"preferred": "rack", "podIndexLabel": LABEL_NODE_RANK},
            kueue.ANNOTATION_PREFERRED_TOPOLOGY,
            "rack",
        ),
        (None, kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY, "true"),
    ],
    ids=["required", "preferred", "unconstrained"],
)
def test_tas_adds_the_gate_and_annotations(
    request_: dict[str, str] | None, annotation: str, value: str
) -> None:
    out = kueue.admission_pod_patch(
        rendered_pod(), ASSIGNMENT, FLAVORS, tas=TasPod(workload="job-abcde", request=request_)
    )
    annotations = out["metadata"]["annotations"]
    assert annotations[kueue.ANNOTATION_WORKLOAD] == "job-abcde"
    assert annotations[annotation] == value
    topology_keys = {
        kueue.ANNOTATION_REQUIRED_TOPOLOGY,
        kueue.ANNOTATION_PREFERRED_TOPOLOGY,
        kueue.ANNOTATION_UNCONSTRAINED_TOPOLOGY,
    }
    assert set(annotations) & topology_keys == {annotation}
    assert out["spec"]["schedulingGates"] == [{"name": kueue.GATE_TOPOLOGY}]
    # The rank label Kueue orders pods by (podIndexLabel) is on every pod already.
    assert out["metadata"]["labels"][LABEL_NODE_RANK] == "1"
    kubernetes_validate.validate(out, K8S_VERSION, strict=True)


# -- status writes ----------------------------------------------------------------------------

R = PodsReadyReason


@pytest.mark.parametrize(
    ("all_ready", "before", "want"),
    [
        (False, None, R.WAIT_FOR_START),
        (True, None, R.STARTED),
        (False, ("False", R.WAIT_FOR_START), R.WAIT_FOR_START),
        (True, ("False", R.WAIT_FOR_START), R.STARTED),
        (True, ("True", R.STARTED), R.STARTED),
        (False, ("True", R.STARTED), R.WAIT_FOR_RECOVERY),
        (False, ("False", R.WAIT_FOR_RECOVERY), R.WAIT_FOR_RECOVERY),
        (True, ("False", R.WAIT_FOR_RECOVERY), R.RECOVERED),
        (True, ("True", R.RECOVERED), R.RECOVERED),
        (False, ("True", R.RECOVERED), R.WAIT_FOR_RECOVERY),
    ],
)
def test_pods_ready_reason(all_ready: bool, before: tuple[str, R] | None, want: R) -> None:
    previous = {"status": before[0], "reason": str(before[1])} if before else None
    assert kueue.pods_ready_reason(all_ready, previous) is want


@pytest.mark.parametrize("before", [None, ("True", R.STARTED), ("False", R.WAIT_FOR_RECOVERY)])
@pytest.mark.parametrize("all_ready", [True, False])
def test_pods_ready_is_wait_for_start_while_not_admitted(
    all_ready: bool, before: tuple[str, R] | None
) -> None:
    """Evicted and waiting, or re-admitted but not yet marked: Kueue's job controller says
    WaitForStart, so the next start counts from zero."""
    previous = {"status": before[0], "reason": str(before[1])} if before else None
    assert kueue.pods_ready_reason(all_ready, previous, admitted=False) is R.WAIT_FOR_START
    raw = workload(cond("QuotaReserved", "False", "Pending"))
    if before:
        raw["status"]["conditions"].append(cond("PodsReady", before[0], str(before[1])))
    got = kueue.pods_ready_condition(raw, all_ready, NOW)
    assert (got["status"], got["reason"]) == ("False", "WaitForStart")


def test_pods_ready_condition_keeps_its_transition_time_while_unchanged() -> None:
    raw = workload(RESERVED, ADMITTED, admission=ADMISSION)
    first = kueue.pods_ready_condition(raw, all_ready=False, now=NOW)
    assert first == {
        "type": "PodsReady",
        "status": "False",
        "reason": "WaitForStart",
        "message": "Not all pods are ready or succeeded",
        "lastTransitionTime": "2026-11-23T15:00:00Z",
        "observedGeneration": 1,
    }
    raw["status"]["conditions"].append(first)
    later = NOW + timedelta(minutes=1)
    same = kueue.pods_ready_condition(raw, all_ready=False, now=later)
    assert same["lastTransitionTime"] == "2026-11-23T15:00:00Z"
    up = kueue.pods_ready_condition(raw, all_ready=True, now=later)
    assert (up["status"], up["reason"], up["lastTransitionTime"]) == (
        "True",
        "Started",
        "2026-11-23T15:01:00Z",
    )


@pytest.mark.parametrize(("succeeded", "reason"), [(True, "Succeeded"), (False, "Failed")])
def test_finished_condition(succeeded: bool, reason: str) -> None:
    raw = workload(RESERVED, ADMITTED, admission=ADMISSION)
    got = kueue.finished_condition(raw, succeeded, "job finished", NOW)
    assert (got["type"], got["status"], got["reason"], got["message"]) == (
        "Finished",
        "True",
        reason,
        "job finished",
    )
    manager, body = kueue.condition_apply(raw, got)
    assert manager == "megatron-operator-Finished"
    assert body == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-abcde", "namespace": "team-a"},
        "status": {"conditions": [got]},
    }


def test_a_reason_kueue_would_reject_is_refused() -> None:
    with pytest.raises(KueueError, match="not CamelCase"):
        kueue.condition("PodsReady", True, "all ready!", "", NOW)


def _by_type(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch["status"]["conditions"]}


@pytest.mark.parametrize(
    ("reason", "requeued"),
    [
        ("Preempted", "True"),
        ("NodeFailures", "True"),
        ("Deactivated", "False"),
        ("PodsReadyTimeout", "False"),
        ("ClusterQueueStopped", "False"),
        ("AdmissionCheck", "False"),
    ],
)
def test_eviction_reset_releases_the_quota(reason: str, requeued: str) -> None:
    evicted = cond("Evicted", "True", reason, f"evicted: {reason}")
    pods_ready = cond("PodsReady", "True", "Started")
    raw = workload(RESERVED, ADMITTED, pods_ready, evicted, admission=ADMISSION)
    before = copy.deepcopy(raw)
    patch = kueue.eviction_reset_patch(raw, NOW)
    assert raw == before
    assert patch["metadata"] == {"resourceVersion": "4711"}
    assert "admission" in patch["status"] and patch["status"]["admission"] is None
    got = _by_type(patch)
    assert set(got) == {"QuotaReserved", "Admitted", "PodsReady", "Evicted", "Requeued"}
    assert got["QuotaReserved"] == {
        "type": "QuotaReserved",
        "status": "False",
        "reason": "Pending",
        "message": f"evicted: {reason}",
        "lastTransitionTime": "2026-11-23T15:00:00Z",
        "observedGeneration": 1,
    }
    assert (got["Admitted"]["status"], got["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (got["Requeued"]["status"], got["Requeued"]["reason"]) == (requeued, reason)
    # Kueue's own conditions pass through unchanged (a merge patch replaces the whole list).
    assert got["Evicted"] == evicted and got["PodsReady"] == pods_ready


def test_eviction_reset_refuses_a_workload_that_is_not_evicted() -> None:
    with pytest.raises(KueueError, match="not evicted"):
        kueue.eviction_reset_patch(workload(RESERVED, ADMITTED, admission=ADMISSION), NOW)
    raw = workload(RESERVED, ADMITTED, PREEMPTED, admission=ADMISSION)
    del raw["metadata"]["resourceVersion"]
    with pytest.raises(KueueError, match="resourceVersion"):
        kueue.eviction_reset_patch(raw, NOW)


def test_a_current_workload_is_not_outdated() -> None:
    job = queued_job({"topology": {"mode": "required", "key": "rack"}})
    wl = kueue.render_workload(job, plan(job.spec))
    stored = copy.deepcopy(wl)
    # What the API server adds to the stored object must not count as a change.
    stored["spec"]["active"] = True
    stored["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = (
        "TCP"
    )
    stored["status"] = {"conditions": [RESERVED]}
    assert kueue.workload_outdated(stored, wl) == []


@pytest.mark.parametrize(
    ("changes", "labels", "want"),
    [
        ({"resources.nodes": 4, "training.globalBatchSize": 128}, {}, ["podSets[trainer].count"]),
        ({"resources.procsPerNode": 4}, {}, ["podSets[trainer].containers"]),
        ({"resources.requests": {"cpu": "4"}}, {}, ["podSets[trainer].containers"]),
        (
            {"resources.nodeSelector": {"pool": "a"}},
            {},
            ["podSets[trainer].nodeSelector"],
        ),
        (
            {"topology": {"mode": "preferred", "key": "rack"}},
            {},
            ["podSets[trainer].topologyRequest", "podSets[trainer].affinity"],
        ),
        ({}, {kueue.LABEL_QUEUE_NAME: "other"}, ["queueName"]),
        (
            {},
            {kueue.LABEL_PRIORITY_CLASS: "urgent"},
            ["priorityClassRef", "priority"],
        ),
    ],
    ids=["nodes", "gpus", "cpu", "node-selector", "topology", "queue", "priority"],
)
def test_outdated_workload_names_what_changed(
    changes: dict[str, Any], labels: dict[str, str], want: list[str]
) -> None:
    base = queued_job({"topology": {"mode": "required", "key": "rack"}})
    old = kueue.render_workload(base, plan(base.spec))
    changed = queued_job({"topology": {"mode": "required", "key": "rack"}, **changes}, labels)
    new = kueue.render_workload(changed, plan(changed.spec), priority=5)
    assert kueue.workload_outdated(old, new) == want


@pytest.mark.parametrize(
    ("assignment", "want"),
    [
        (
            # As Kueue v0.19.2 wrote it for 4 ranks on a rack of 4 (tests/integration).
            {
                "levels": ["kubernetes.io/hostname"],
                "slices": [
                    {
                        "domainCount": 4,
                        "podCounts": {"universal": 1},
                        "valuesPerLevel": [
                            {
                                "individual": {
                                    "prefix": "gpu-node-0",
                                    "roots": ["08", "09", "10", "11"],
                                }
                            }
                        ],
                    }
                ],
            },
            [{"kubernetes.io/hostname": f"gpu-node-0{n}"} for n in ("08", "09", "10", "11")],
        ),
        (
            # 4 pods in rack-1, 2 in rack-2, both in block-1.
            {
                "levels": ["block", "rack"],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [
                            {"universal": "block-1"},
                            {"individual": {"prefix": "rack-", "roots": ["1", "2"]}},
                        ],
                        "podCounts": {"individual": [4, 2]},
                    }
                ],
            },
            [{"block": "block-1", "rack": "rack-1"}] * 4
            + [{"block": "block-1", "rack": "rack-2"}] * 2,
        ),
        (
            # Two slices, with prefixes and suffixes.
            {
                "levels": ["kubernetes.io/hostname"],
                "slices": [
                    {
                        "domainCount": 2,
                        "valuesPerLevel": [
                            {"individual": {"prefix": "r1-", "roots": ["a", "b"], "suffix": "-x"}}
                        ],
                        "podCounts": {"universal": 1},
                    },
                    {
                        "domainCount": 1,
                        "valuesPerLevel": [{"individual": {"roots": ["r2-c"]}}],
                        "podCounts": {"individual": [2]},
                    },
                ],
            },
            [
                {"kubernetes.io/hostname": "r1-a-x"},
                {"kubernetes.io/hostname": "r1-b-x"},
                {"kubernetes.io/hostname": "r2-c"},
                {"kubernetes.io/hostname": "r2-c"},
            ],
        ),
        ({}, []),
    ],
    ids=["kueue-0.19", "universal-and-prefix", "slices", "empty"],
)
def test_topology_slots(assignment: dict[str, Any], want: list[dict[str, str]]) -> None:
    assert kueue.topology_slots(assignment) == want


def test_topology_slots_refuses_an_inconsistent_slice() -> None:
    broken = {
        "levels": ["rack"],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [{"individual": {"roots": ["r1"]}}],
                "podCounts": {"universal": 1},
            }
        ],
    }
    with pytest.raises(KueueError, match="2 domains"):
        kueue.topology_slots(broken)
