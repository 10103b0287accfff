"""Kueue's external-controller protocol as pure data: no kopf, no Kubernetes client.

Kueue's Go `jobframework` cannot drive a Python controller, so the operator owns a `Workload`
(kueue.x-k8s.io/v1beta2) for each queued MegatronJob, as Kueue's own integrations do
(`pkg/controller/jobframework/reconciler.go`). This module decides everything about it:

- `render_workload`: the Workload to create (one podSet per pod role, requests copied from the
  rendered pods, priority, topology request);
- `workload_state`: a small typed view of a Workload read back (pending, admitted, evicted, ...);
- `admission_pod_patch`: a rendered pod as it must be created once admitted (flavor node labels and
  tolerations, admission-check podSetUpdates, the podset label, the TAS gate and annotations);
- the status writes as data: `pods_ready_condition` and `finished_condition` (each applied alone,
  server-side, with its own field manager), and `eviction_reset_patch` (a JSON merge patch).

The `cluster` layer performs the I/O; docs/kueue.md describes the whole protocol.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from megatron_operator.api.job import MegatronJob
from megatron_operator.api.managedby import MULTIKUEUE
from megatron_operator.core.names import LABEL_NODE_RANK, LABEL_RESTART_ATTEMPT
from megatron_operator.core.planner import Plan
from megatron_operator.core.render import job_labels, owner_reference, pod

Obj = dict[str, Any]

GROUP: Final = "kueue.x-k8s.io"
VERSION: Final = "v1beta2"
API_VERSION: Final = f"{GROUP}/{VERSION}"
WORKLOAD_KIND: Final = "Workload"
WORKLOAD_PLURAL: Final = "workloads"
RESOURCE_FLAVOR_PLURAL: Final = "resourceflavors"

# On the MegatronJob (never on pods): the LocalQueue, and optionally a WorkloadPriorityClass.
LABEL_QUEUE_NAME: Final = f"{GROUP}/queue-name"
LABEL_PRIORITY_CLASS: Final = f"{GROUP}/priority-class"
# On the Workload: the owning job's uid (how Kueue's integrations find a job's Workloads).
LABEL_JOB_UID: Final = f"{GROUP}/job-uid"
# On a job that MultiKueue copied to a worker cluster: the Workload it already made for it there
# (a copy of the manager's; an annotation since Kueue 0.18's WorkloadIdentifierAnnotations, a
# label before, the same key), and which manager made it.
PREBUILT_WORKLOAD: Final = f"{GROUP}/prebuilt-workload-name"
LABEL_MULTIKUEUE_ORIGIN: Final = f"{GROUP}/multikueue-origin"
# On pods.
LABEL_PODSET: Final = f"{GROUP}/podset"
ANNOTATION_WORKLOAD: Final = f"{GROUP}/workload"
ANNOTATION_REQUIRED_TOPOLOGY: Final = f"{GROUP}/podset-required-topology"
ANNOTATION_PREFERRED_TOPOLOGY: Final = f"{GROUP}/podset-preferred-topology"
ANNOTATION_UNCONSTRAINED_TOPOLOGY: Final = f"{GROUP}/podset-unconstrained-topology"
GATE_TOPOLOGY: Final = f"{GROUP}/topology"
# Kueue's finalizer on Workloads; whoever adds it removes it (we do not add it).
FINALIZER_RESOURCE_IN_USE: Final = f"{GROUP}/resource-in-use"

# The one pod role a MegatronJob has: every node runs the same trainer pod.
PODSET_TRAINER: Final = "trainer"
# Field managers for our server-side applies of one condition each, as Kueue's job controller
# names its own (`<controller>-<condition type>`), so we never take over Kueue's fields.
FIELD_MANAGER_PREFIX: Final = "megatron-operator"

MAX_NAME: Final = 63
HASH_LENGTH: Final = 5
MAX_MESSAGE: Final = 32768
# metav1.Condition's reason pattern: Kueue rejects a status write whose reason breaks it.
REASON_PATTERN: Final = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


class KueueError(ValueError):
    """Input that cannot be turned into a valid Workload or pod; the message names the fix."""


class ConditionType(StrEnum):
    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    PODS_READY = "PodsReady"
    FINISHED = "Finished"


class PodsReadyReason(StrEnum):
    WAIT_FOR_START = "WaitForStart"
    STARTED = "Started"
    WAIT_FOR_RECOVERY = "WaitForRecovery"
    RECOVERED = "Recovered"


class FinishedReason(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    # A prebuilt Workload that does not match its job (Kueue's jobframework says the same):
    # MultiKueue then dispatches the job again rather than counting it finished.
    OUT_OF_SYNC = "OutOfSync"


class EvictionReason(StrEnum):
    """Kueue's reasons on Evicted=True (others may appear; they are copied as they are)."""

    PREEMPTED = "Preempted"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    ADMISSION_CHECK = "AdmissionCheck"
    CLUSTER_QUEUE_STOPPED = "ClusterQueueStopped"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    NODE_FAILURES = "NodeFailures"
    DEACTIVATED = "Deactivated"


# Evictions after which Kueue requeues the Workload at once (Requeued=True); after the others
# (deactivation, a stopped queue, a timeout) Requeued is False with the eviction's reason.
REQUEUE_AFTER: Final = frozenset({EvictionReason.PREEMPTED, EvictionReason.NODE_FAILURES})


class WorkloadPhase(StrEnum):
    """Where a Workload stands, from the operator's point of view."""

    PENDING = "Pending"  # no quota: waiting, inadmissible, deactivated, or evicted and released
    RESERVED = "Reserved"  # quota reserved, admission checks not yet ready: no pods yet
    ADMITTED = "Admitted"  # create (or keep) the pods
    EVICTED = "Evicted"  # stop the pods, then reset the status (eviction_reset_patch)
    FINISHED = "Finished"


# -- names and the Workload -------------------------------------------------------------------


def queue_name(job: MegatronJob) -> str | None:
    """The LocalQueue named by the job's label, or None: then Kueue is not involved at all."""
    name = job.metadata.labels.get(LABEL_QUEUE_NAME, "").strip()
    return name or None


def workload_name(job_name: str, uid: str) -> str:
    """`<job>-<5 hex chars>`, at most 63 characters. The hash covers the uid, so a job deleted
    and created again under the same name gets a new Workload, not its predecessor's."""
    if not job_name or not uid:
        raise KueueError("a Workload name needs the job's name and metadata.uid (read it back)")
    digest = hashlib.sha256(f"{job_name}\0{uid}".encode()).hexdigest()[:HASH_LENGTH]
    prefix = job_name[: MAX_NAME - HASH_LENGTH - 1].rstrip("-")
    return f"{prefix}-{digest}"


def prebuilt_workload_of(annotations: Mapping[str, str], labels: Mapping[str, str]) -> str | None:
    """The Workload MultiKueue made for a job it copied to this (worker) cluster, or None: the
    annotation first, then the label (Kueue's jobframework PrebuiltWorkloadNameFor)."""
    for where in (annotations, labels):
        name = str(where.get(PREBUILT_WORKLOAD) or "").strip()
        if name:
            return name
    return None


def prebuilt_workload(job: MegatronJob) -> str | None:
    """The prebuilt Workload of a job MultiKueue copied to this (worker) cluster. Never for a
    job MultiKueue dispatches from here (the manager): MultiKueue puts the name on the worker's
    copy only, so on the manager it could only name someone else's Workload."""
    if job.spec.managed_by == MULTIKUEUE:
        return None
    return prebuilt_workload_of(job.metadata.annotations, job.metadata.labels)


def prebuilt_name_problem(job_name: str, name: str) -> str | None:
    """Why `name` cannot be the prebuilt Workload of the job `job_name` (None: it can).
    MultiKueue names the worker's copy as the manager's Workload, `workload_name` of the
    manager's job, whose name the copied job keeps: `<job>-<5 hex>`. Any other name is another
    job's Workload, which the operator neither reads, takes nor touches."""
    prefix = job_name[: MAX_NAME - HASH_LENGTH - 1].rstrip("-")
    if re.fullmatch(re.escape(prefix) + f"-[0-9a-f]{{{HASH_LENGTH}}}", name):
        return None
    return (
        f"metadata: {PREBUILT_WORKLOAD} names Workload {name}, which is not this job's "
        f"(MultiKueue names it {prefix}-<hash>): the operator neither takes nor touches it"
    )


def job_workload_name(job: MegatronJob) -> str:
    """The job's Workload: the prebuilt one when MultiKueue made it, else our own name."""
    return prebuilt_workload(job) or workload_name(job.name, job.metadata.uid or "")


def adoption_patch(raw: Mapping[str, Any], job: MegatronJob) -> Obj | None:
    """The merge patch that makes a prebuilt Workload the job's (a controller ownerReference
    and the job-uid labels, as Kueue's jobframework does for its own jobs); None when it is
    already. A Workload another object controls, one MultiKueue did not make (no origin label),
    or one another MultiKueue manager made (its origin label is not the job's), is never taken:
    KueueError names it."""
    meta = raw.get("metadata") or {}
    refs = [dict(r) for r in meta.get("ownerReferences") or []]
    uid = job.metadata.uid or ""
    controller = next((r for r in refs if r.get("controller")), None)
    if controller is not None:
        if controller.get("uid") == uid:
            return None
        raise KueueError(
            f"Workload {meta.get('name')} is controlled by {controller.get('kind')} "
            f"{controller.get('name')} (uid {controller.get('uid')}), not by this job"
        )
    origin = (meta.get("labels") or {}).get(LABEL_MULTIKUEUE_ORIGIN)
    if origin is None:
        raise KueueError(
            f"Workload {meta.get('name')} has no {LABEL_MULTIKUEUE_ORIGIN} label: MultiKueue did "
            "not make it, and the operator takes over no other Workload"
        )
    if job.metadata.labels.get(LABEL_MULTIKUEUE_ORIGIN) != origin:
        raise KueueError(
            f"Workload {meta.get('name')} was made by MultiKueue manager {origin!r}, but the job "
            f"carries {LABEL_MULTIKUEUE_ORIGIN}={job.metadata.labels.get(LABEL_MULTIKUEUE_ORIGIN)!r}"
        )
    version = meta.get("resourceVersion")
    if not version:
        raise KueueError("metadata.resourceVersion is missing: patch a Workload read back")
    return {
        "metadata": {
            "resourceVersion": str(version),
            "ownerReferences": [*refs, owner_reference(job)],
            "labels": {**job_labels(job), LABEL_JOB_UID: uid},
        }
    }


def priority_class_ref(job: MegatronJob) -> Obj | None:
    """What the job's priority comes from, for the caller to look up its value: a Kueue
    WorkloadPriorityClass (label kueue.x-k8s.io/priority-class, which Kueue prefers, as for its
    own jobs) or else the pods' PriorityClass (spec.priorityClassName)."""
    wpc = job.metadata.labels.get(LABEL_PRIORITY_CLASS, "").strip()
    if wpc:
        return {"group": GROUP, "kind": "WorkloadPriorityClass", "name": wpc}
    if job.spec.priority_class_name:
        return {
            "group": "scheduling.k8s.io",
            "kind": "PriorityClass",
            "name": job.spec.priority_class_name,
        }
    return None


def topology_request(job: MegatronJob) -> Obj | None:
    """spec.topology as Kueue's TAS reads it; podIndexLabel makes Kueue place pods in rank
    order (rank r goes to the r-th slot of its assignment), so neighbouring ranks share a
    domain."""
    topo = job.spec.topology
    if topo.mode == "none" or not topo.key:
        return None
    return {topo.mode: topo.key, "podIndexLabel": LABEL_NODE_RANK}


def pod_template(job: MegatronJob, plan: Plan) -> Obj:
    """The podSet template: rank 0's rendered pod, so the requests Kueue charges are exactly the
    pods' requests. Only labels and annotations may be in its metadata; labels that differ per
    pod (rank, attempt) are left out."""
    rendered = pod(job, plan, 0, 0)
    meta = rendered["metadata"]
    labels = {
        k: v for k, v in meta["labels"].items() if k not in (LABEL_NODE_RANK, LABEL_RESTART_ATTEMPT)
    }
    return {
        "metadata": {"labels": labels, "annotations": dict(meta.get("annotations", {}))},
        "spec": copy.deepcopy(rendered["spec"]),
    }


def render_podsets(job: MegatronJob, plan: Plan) -> list[Obj]:
    """The Workload's podSets: one per pod role (a MegatronJob has one, every node alike). Its
    count is every pod the job keeps: the gang's, and its spares (resources.spareNodes), which
    hold their resources as the gang's pods do (docs/architecture.md, "Spare nodes")."""
    count = plan.nodes + job.spec.resources.spare_nodes
    podset: Obj = {"name": PODSET_TRAINER, "count": count, "template": pod_template(job, plan)}
    request = topology_request(job)
    if request is not None:
        podset["topologyRequest"] = request
    return [podset]


def prebuilt_outdated(raw: Mapping[str, Any], job: MegatronJob, plan: Plan) -> list[str]:
    """How a prebuilt Workload (made by MultiKueue from the manager's) differs from what this
    job's pods need: its queue and podSets (priority is the manager's to decide)."""
    desired = {"spec": {"queueName": queue_name(job), "podSets": render_podsets(job, plan)}}
    have = {
        "spec": {k: v for k, v in (raw.get("spec") or {}).items() if k in ("queueName", "podSets")}
    }
    return workload_outdated(have, desired)


def render_workload(job: MegatronJob, plan: Plan, priority: int | None = None) -> Obj:
    """The Workload for a queued job. `priority` is the value of the class `priority_class_ref`
    names (Kueue requires it whenever the ref is set)."""
    queue = queue_name(job)
    if queue is None:
        raise KueueError(f"metadata.labels: label {LABEL_QUEUE_NAME} names no LocalQueue")
    uid = job.metadata.uid or ""
    spec: Obj = {"queueName": queue, "podSets": render_podsets(job, plan)}
    ref = priority_class_ref(job)
    if ref is not None:
        if priority is None:
            raise KueueError(
                f"priority: the value of {ref['kind']} {ref['name']} is needed (read the class)"
            )
        spec["priorityClassRef"] = ref
        spec["priority"] = priority
    return {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(job.name, uid),
            "namespace": job.namespace,
            "labels": {**job_labels(job), LABEL_JOB_UID: uid},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }


def _quota_view(podset: Mapping[str, Any]) -> Obj:
    """What Kueue's quota and flavor choice depend on, from one podSet. The API server adds
    schema defaults to the stored template (a port's protocol, ...), so templates are compared
    by these fields, not whole."""
    template = (podset.get("template") or {}).get("spec") or {}

    def resources(key: str) -> list[Obj]:
        return [
            {"name": c.get("name"), "resources": c.get("resources") or {}}
            for c in template.get(key) or []
        ]

    return {
        "count": podset.get("count"),
        "minCount": podset.get("minCount"),
        "topologyRequest": podset.get("topologyRequest"),
        "containers": resources("containers"),
        "initContainers": resources("initContainers"),
        "nodeSelector": template.get("nodeSelector") or {},
        "tolerations": template.get("tolerations") or [],
        "affinity": template.get("affinity") or {},
        "priorityClassName": template.get("priorityClassName"),
    }


def workload_outdated(raw: Mapping[str, Any], desired: Mapping[str, Any]) -> list[str]:
    """The fields in which an existing Workload differs from the one `render_workload` gives
    now (empty: it is current). podSets are immutable, so an outdated Workload is replaced (only
    while no pod runs), as Kueue's own integrations do when a suspended job changes."""
    have, want = raw.get("spec") or {}, desired.get("spec") or {}
    diffs = [
        key
        for key in ("queueName", "priorityClassRef", "priority")
        if have.get(key) != want.get(key)
    ]
    have_sets = {str(ps.get("name")): ps for ps in have.get("podSets") or []}
    want_sets = {str(ps.get("name")): ps for ps in want.get("podSets") or []}
    if set(have_sets) != set(want_sets):
        return [*diffs, "podSets"]
    for name, ps in want_sets.items():
        have_view, want_view = _quota_view(have_sets[name]), _quota_view(ps)
        diffs += [f"podSets[{name}].{key}" for key in want_view if have_view[key] != want_view[key]]
    return diffs


# -- reading a Workload -----------------------------------------------------------------------


@dataclass(frozen=True)
class PodSetAdmission:
    """One podSetAssignment of an admission."""

    name: str
    count: int
    flavors: Mapping[str, str]  # resource -> ResourceFlavor name
    topology_assignment: Obj | None = None


@dataclass(frozen=True)
class TasPod:
    """What a pod needs under topology-aware scheduling: Kueue ungates it only with these."""

    workload: str
    request: Obj | None  # the podSet's topologyRequest; None is unconstrained


@dataclass(frozen=True)
class QueuedState:
    phase: WorkloadPhase
    reason: str = ""
    message: str = ""  # Kueue's own words (e.g. why it is pending), to copy into events
    cluster_queue: str | None = None
    podsets: tuple[PodSetAdmission, ...] = ()
    active: bool = True
    name: str = ""
    topology_requests: Mapping[str, Obj] = field(default_factory=dict)
    podset_updates: tuple[Obj, ...] = ()

    @property
    def flavors(self) -> tuple[str, ...]:
        """Every ResourceFlavor of the admission, sorted (the status shows them)."""
        return tuple(sorted({f for ps in self.podsets for f in ps.flavors.values()}))

    def assignment(self, podset: str) -> PodSetAdmission:
        for ps in self.podsets:
            if ps.name == podset:
                return ps
        raise KueueError(f"status.admission has no podSetAssignment for podSet {podset!r}")

    def updates_for(self, podset: str) -> tuple[Obj, ...]:
        return tuple(u for u in self.podset_updates if u.get("name") == podset)

    def tas_for(self, podset: str) -> TasPod | None:
        """TAS data for pods of `podset`, only when Kueue admitted it with a topology."""
        if self.assignment(podset).topology_assignment is None:
            return None
        return TasPod(workload=self.name, request=self.topology_requests.get(podset))


def topology_slots(assignment: Mapping[str, Any]) -> list[dict[str, str]]:
    """A topologyAssignment expanded to the node labels of each pod slot, in order. With a
    podIndexLabel Kueue gives the pod of rank r slot r, so this says where each rank goes (for
    the status or an event). The format is Kueue v0.19's v1beta2: levels plus compressed slices,
    each level's values `universal` or `individual` {prefix, roots, suffix}, pod counts
    `universal` or `individual`."""
    levels = list(assignment.get("levels") or [])
    slots: list[dict[str, str]] = []
    for piece in assignment.get("slices") or []:
        count = int(piece.get("domainCount") or 0)
        columns = []
        for level in piece.get("valuesPerLevel") or []:
            if level.get("universal") is not None:
                columns.append([str(level["universal"])] * count)
                continue
            each = level.get("individual") or {}
            prefix, suffix = each.get("prefix") or "", each.get("suffix") or ""
            columns.append([f"{prefix}{root}{suffix}" for root in each.get("roots") or []])
        counts = piece.get("podCounts") or {}
        pods = counts.get("individual") or [counts.get("universal") or 0] * count
        if any(len(column) != count for column in columns) or len(pods) != count:
            raise KueueError(f"topologyAssignment: a slice does not describe {count} domains")
        for d in range(count):
            labels = {levels[i]: column[d] for i, column in enumerate(columns)}
            slots.extend(dict(labels) for _ in range(int(pods[d])))
    return slots


def find_condition(raw: Mapping[str, Any], type_: str) -> Obj | None:
    for cond in (raw.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def _true(raw: Mapping[str, Any], type_: str) -> bool:
    cond = find_condition(raw, type_)
    return cond is not None and cond.get("status") == "True"


def _podsets(admission: Mapping[str, Any]) -> tuple[PodSetAdmission, ...]:
    out = []
    for psa in admission.get("podSetAssignments") or []:
        out.append(
            PodSetAdmission(
                name=str(psa.get("name", "main")),
                count=int(psa.get("count") or 0),
                flavors=dict(psa.get("flavors") or {}),
                topology_assignment=psa.get("topologyAssignment"),
            )
        )
    return tuple(out)


def workload_state(raw: Mapping[str, Any]) -> QueuedState:
    """A Workload read from the API server, as one of WorkloadPhase plus what goes with it."""
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    admission = status.get("admission") or None
    common: dict[str, Any] = {
        "active": spec.get("active", True) is not False,
        "name": str((raw.get("metadata") or {}).get("name", "")),
        "topology_requests": {
            str(ps.get("name", "main")): dict(ps["topologyRequest"])
            for ps in spec.get("podSets") or []
            if ps.get("topologyRequest")
        },
        "podset_updates": tuple(
            dict(u)
            for check in status.get("admissionChecks") or []
            for u in check.get("podSetUpdates") or []
        ),
    }
    if admission:
        common["cluster_queue"] = admission.get("clusterQueue")
        common["podsets"] = _podsets(admission)

    def of(phase: WorkloadPhase, type_: str) -> QueuedState:
        cond = find_condition(raw, type_) or {}
        return QueuedState(
            phase=phase,
            reason=str(cond.get("reason", "")),
            message=str(cond.get("message", "")),
            **common,
        )

    if _true(raw, ConditionType.FINISHED):
        return of(WorkloadPhase.FINISHED, ConditionType.FINISHED)
    holds_quota = admission is not None or _true(raw, ConditionType.QUOTA_RESERVED)
    if _true(raw, ConditionType.EVICTED) and holds_quota:
        return of(WorkloadPhase.EVICTED, ConditionType.EVICTED)
    if _true(raw, ConditionType.ADMITTED) and admission is not None:
        return of(WorkloadPhase.ADMITTED, ConditionType.ADMITTED)
    if holds_quota:
        return of(WorkloadPhase.RESERVED, ConditionType.QUOTA_RESERVED)
    return of(WorkloadPhase.PENDING, ConditionType.QUOTA_RESERVED)


# -- pods of an admitted Workload -------------------------------------------------------------


def _merge_map(target: dict[str, str], extra: Mapping[str, str], what: str) -> None:
    for key, value in extra.items():
        if key in target and target[key] != value:
            raise KueueError(
                f"{what}: {key}={value!r} conflicts with {key}={target[key]!r} already on the "
                "pod; make the job's nodeSelector agree with the ResourceFlavor"
            )
        target[key] = value


def _merge_tolerations(target: list[Obj], extra: Sequence[Mapping[str, Any]]) -> None:
    for tol in extra:
        if dict(tol) not in target:
            target.append(dict(tol))


def admission_pod_patch(
    pod_obj: Mapping[str, Any],
    assignment: PodSetAdmission,
    flavors: Mapping[str, Mapping[str, Any]],
    podset_updates: Sequence[Mapping[str, Any]] = (),
    tas: TasPod | None = None,
) -> Obj:
    """The pod to create for an admitted podSet (a new dict; the input is left alone).

    `flavors` maps each ResourceFlavor name of the assignment to the ResourceFlavor object;
    `podset_updates` are the admission checks' PodSetUpdates (`QueuedState.updates_for`); `tas`
    (`QueuedState.tas_for`) is given when Kueue assigned a topology.
    """
    # Only what this writes is copied: the rest (the template's parts) is shared with the gang's
    # other pods, and a deep copy of each pod would undo that (core/overlay.py).
    out = dict(pod_obj)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    spec = out["spec"] = dict(out.get("spec") or {})
    labels = meta["labels"] = dict(meta.get("labels") or {})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    selector: dict[str, str] = dict(spec.get("nodeSelector") or {})
    tolerations: list[Obj] = list(spec.get("tolerations") or [])
    spec["nodeSelector"], spec["tolerations"] = selector, tolerations
    for name in sorted(set(assignment.flavors.values())):
        if name not in flavors:
            raise KueueError(
                f"ResourceFlavor {name} (admitted for {assignment.name}) was not found"
            )
        flavor_spec = flavors[name].get("spec") or {}
        _merge_map(
            selector, flavor_spec.get("nodeLabels") or {}, f"ResourceFlavor {name} nodeLabels"
        )
        _merge_tolerations(tolerations, flavor_spec.get("tolerations") or [])
    for update in podset_updates:
        if update.get("name") != assignment.name:
            continue
        _merge_map(labels, update.get("labels") or {}, "podSetUpdate labels")
        _merge_map(annotations, update.get("annotations") or {}, "podSetUpdate annotations")
        _merge_map(selector, update.get("nodeSelector") or {}, "podSetUpdate nodeSelector")
        _merge_tolerations(tolerations, update.get("tolerations") or [])
    labels[LABEL_PODSET] = assignment.name
    if tas is not None:
        annotations[ANNOTATION_WORKLOAD] = tas.workload
        request = tas.request or {}
        if request.get("required"):
            annotations[ANNOTATION_REQUIRED_TOPOLOGY] = str(request["required"])
        elif request.get("preferred"):
            annotations[ANNOTATION_PREFERRED_TOPOLOGY] = str(request["preferred"])
        else:
            annotations[ANNOTATION_UNCONSTRAINED_TOPOLOGY] = "true"
        gates: list[Obj] = list(spec.get("schedulingGates") or [])
        if {"name": GATE_TOPOLOGY} not in gates:
            gates.append({"name": GATE_TOPOLOGY})
        spec["schedulingGates"] = gates
    # Leave no empty fields behind (the rendered pod may have had none of them).
    for key, value in (("nodeSelector", selector), ("tolerations", tolerations)):
        if not value:
            spec.pop(key)
    if not annotations:
        meta.pop("annotations")
    return out


# -- status writes ----------------------------------------------------------------------------


def format_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    previous: Mapping[str, Any] | None = None,
    generation: int | None = None,
) -> Obj:
    """A metav1.Condition; lastTransitionTime stays the previous one unless the status flips."""
    if not REASON_PATTERN.fullmatch(reason):
        raise KueueError(
            f"condition {type_}: reason {reason!r} is not CamelCase (Kueue rejects it)"
        )
    value = "True" if status else "False"
    kept = previous is not None and previous.get("status") == value
    cond: Obj = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": (
            str(previous["lastTransitionTime"])
            if kept and previous and previous.get("lastTransitionTime")
            else format_time(now)
        ),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


def pods_ready_reason(
    all_ready: bool, previous: Mapping[str, Any] | None, admitted: bool = True
) -> PodsReadyReason:
    """PodsReady as Kueue's own job controller decides it (jobframework, v0.19): WaitForStart
    until every pod is Ready for the first time since admission, then Started; after a failure
    WaitForRecovery until all are Ready again, then Recovered. Not admitted (before admission or
    after an eviction) is always WaitForStart, so a re-admitted job starts over."""
    if not admitted:
        return PodsReadyReason.WAIT_FOR_START
    before = str(previous.get("reason", "")) if previous else ""
    recovering = before in (PodsReadyReason.WAIT_FOR_RECOVERY, PodsReadyReason.RECOVERED)
    if all_ready:
        return PodsReadyReason.RECOVERED if recovering else PodsReadyReason.STARTED
    was_ready = previous is not None and previous.get("status") == "True"
    if was_ready or before == PodsReadyReason.WAIT_FOR_RECOVERY:
        return PodsReadyReason.WAIT_FOR_RECOVERY
    return PodsReadyReason.WAIT_FOR_START


_READY_MESSAGE: Final = "All pods reached readiness and the workload is running"
# Kueue's own messages, so `kubectl get workload -o yaml` reads the same for every integration.
_PODS_READY_MESSAGE: Final = {
    PodsReadyReason.WAIT_FOR_START: "Not all pods are ready or succeeded",
    PodsReadyReason.STARTED: _READY_MESSAGE,
    PodsReadyReason.WAIT_FOR_RECOVERY: "At least one pod has failed, waiting for recovery",
    PodsReadyReason.RECOVERED: _READY_MESSAGE,
}


def pods_ready_condition(raw: Mapping[str, Any], all_ready: bool, now: datetime) -> Obj:
    """The PodsReady condition to apply, given whether every pod of the current attempt is
    Ready. Report it whenever it changes: with waitForPodsReady (on by default since Kueue
    0.19) a Workload that never reports Started is evicted with PodsReadyTimeout."""
    previous = find_condition(raw, ConditionType.PODS_READY)
    admitted = _true(raw, ConditionType.ADMITTED)
    reason = pods_ready_reason(all_ready, previous, admitted)
    ready = reason in (PodsReadyReason.STARTED, PodsReadyReason.RECOVERED)
    return condition(
        ConditionType.PODS_READY,
        ready,
        reason,
        _PODS_READY_MESSAGE[reason],
        now,
        previous,
        _generation(raw),
    )


def out_of_sync_condition(raw: Mapping[str, Any], message: str, now: datetime) -> Obj:
    """Finished=True/OutOfSync for a prebuilt Workload that does not match its job."""
    previous = find_condition(raw, ConditionType.FINISHED)
    return condition(
        ConditionType.FINISHED,
        True,
        FinishedReason.OUT_OF_SYNC,
        message,
        now,
        previous,
        _generation(raw),
    )


def finished_condition(raw: Mapping[str, Any], succeeded: bool, message: str, now: datetime) -> Obj:
    """Finished=True, which releases the quota. A gang restart inside an admitted job is not a
    finish: only the job's final Succeeded or Failed is."""
    reason = FinishedReason.SUCCEEDED if succeeded else FinishedReason.FAILED
    previous = find_condition(raw, ConditionType.FINISHED)
    return condition(ConditionType.FINISHED, True, reason, message, now, previous, _generation(raw))


def condition_apply(raw: Mapping[str, Any], cond: Mapping[str, Any]) -> tuple[str, Obj]:
    """(field manager, body) of a server-side apply to `/status` that owns one condition."""
    meta = raw.get("metadata") or {}
    body: Obj = {
        "apiVersion": API_VERSION,
        "kind": WORKLOAD_KIND,
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace")},
        "status": {"conditions": [dict(cond)]},
    }
    return f"{FIELD_MANAGER_PREFIX}-{cond['type']}", body


def eviction_reset_patch(raw: Mapping[str, Any], now: datetime) -> Obj:
    """The JSON merge patch on `/status` that hands the quota back after an eviction, once no
    pod of the job is live: QuotaReserved=False/Pending with admission null, Admitted=False/
    NoReservation, Requeued (True after preemption or node failures, else False), each with the
    eviction's reason and message. A merge patch replaces the whole conditions list, so it
    carries metadata.resourceVersion: a concurrent write by Kueue makes it fail (409) instead of
    being lost; read the Workload again and retry."""
    evicted = find_condition(raw, ConditionType.EVICTED)
    if evicted is None or evicted.get("status") != "True":
        raise KueueError("the Workload is not evicted (no Evicted=True condition)")
    version = (raw.get("metadata") or {}).get("resourceVersion")
    if not version:
        raise KueueError("metadata.resourceVersion is missing: patch a Workload read back")
    reason = str(evicted.get("reason") or "Evicted")
    if not REASON_PATTERN.fullmatch(reason):
        reason = "Evicted"
    message = str(evicted.get("message", ""))
    generation = _generation(raw)
    conditions = [dict(c) for c in (raw.get("status") or {}).get("conditions") or []]
    updates = [
        (ConditionType.QUOTA_RESERVED, False, "Pending", message),
        (ConditionType.ADMITTED, False, "NoReservation", "The workload has no reservation"),
        (ConditionType.REQUEUED, reason in REQUEUE_AFTER, reason, message),
    ]
    for type_, status, why, text in updates:
        index = next((i for i, c in enumerate(conditions) if c.get("type") == type_), None)
        previous = conditions[index] if index is not None else None
        new = condition(type_, status, why, text, now, previous, generation)
        if index is None:
            conditions.append(new)
        else:
            conditions[index] = new
    return {
        "metadata": {"resourceVersion": str(version)},
        "status": {"admission": None, "conditions": conditions},
    }


def _generation(raw: Mapping[str, Any]) -> int | None:
    value = (raw.get("metadata") or {}).get("generation")
    return int(value) if value is not None else None
