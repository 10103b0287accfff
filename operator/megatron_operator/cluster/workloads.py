"""The Kueue side of the API: the job's Workload, ResourceFlavors, priority classes, and a watch
of our Workloads. The decisions are `core/queueing.py`; this module reads and writes.

Used only when the operator runs with Kueue (`mjob operator --kueue auto|on`); a job without the
queue label never reaches any of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

import kubernetes
from kubernetes.client.exceptions import ApiException

from megatron_operator.api import SpecError, load_job
from megatron_operator.api.managedby import Manager, manager_of_job
from megatron_operator.cluster.kube import ChildConflict, Conflict, Kube, call, call_json
from megatron_operator.cluster.watch import WATCH_SECONDS, Watcher
from megatron_operator.core import kueue
from megatron_operator.core.kueue import WorkloadPhase
from megatron_operator.core.names import LABEL_JOB_NAME
from megatron_operator.core.observe import controller_uid
from megatron_operator.core.queueing import QueueWorld, WorkloadActions

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
RESET_ATTEMPTS: Final = 5


def kueue_installed(kube: Kube) -> bool:
    """Whether the cluster serves Kueue's v1beta2 Workloads (discovery: needs no RBAC)."""
    try:
        doc = call_json(kube.custom.get_api_resources, kueue.GROUP, kueue.VERSION)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.get("name") == kueue.WORKLOAD_PLURAL for r in doc.get("resources") or [])


def kueue_permitted(kube: Kube, namespaces: tuple[str, ...]) -> list[str]:
    """The Workload rights the operator lacks (self-subject access reviews), in each watched
    namespace or cluster-wide: empty when it may run the integration."""
    authz = kubernetes.client.AuthorizationV1Api(kube.client)
    missing = []
    for namespace in namespaces or ("",):
        for verb in ("create", "watch", "delete"):
            review = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "group": kueue.GROUP,
                        "resource": kueue.WORKLOAD_PLURAL,
                        "verb": verb,
                        "namespace": namespace,
                    }
                },
            }
            doc = call_json(authz.create_self_subject_access_review, review)
            if not (doc.get("status") or {}).get("allowed"):
                missing.append(f"{verb} workloads" + (f" in {namespace}" if namespace else ""))
    return missing


class Queues:
    """Workload reads and writes for the controller."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.custom = kube.custom
        self.scheduling = kubernetes.client.SchedulingV1Api(kube.client)
        # The uid of each Workload last observed as the job's: deletes carry it as a
        # precondition, so only that very object goes.
        self.uids: dict[tuple[str, str], str] = {}

    # --- reads
    def observe(self, job: Mapping[str, Any]) -> QueueWorld | None:
        """What the state machine needs about a labelled job's Workload; None: no label."""
        meta = job.get("metadata") or {}
        local_queue = str((meta.get("labels") or {}).get(kueue.LABEL_QUEUE_NAME, "")).strip()
        if not local_queue:
            return None
        namespace, uid = str(meta["namespace"]), str(meta.get("uid") or "")
        # A job MultiKueue copied here runs under the Workload it made (a copy of the manager's,
        # controlled by no object until this job takes it over). Not on the manager: there the
        # name can only be someone else's Workload.
        prebuilt = None
        if manager_of_job(job) is not Manager.MULTIKUEUE:
            prebuilt = kueue.prebuilt_workload_of(
                meta.get("annotations") or {}, meta.get("labels") or {}
            )
        name = prebuilt or kueue.workload_name(str(meta["name"]), uid)
        foreign = kueue.prebuilt_name_problem(str(meta["name"]), prebuilt) if prebuilt else None
        raw = self.get(namespace, name) if foreign is None else None
        controller = controller_uid(raw.get("metadata")) if raw is not None else None
        if raw is not None and controller != uid and (controller is not None or not prebuilt):
            # Someone else's object under our Workload's name: not read, used or deleted.
            foreign = (
                f"Workload {name} exists and is not this job's (its controller is not the job): "
                "the operator neither uses nor deletes it; delete it, or re-create the job "
                "under another name"
            )
            raw = None
        if raw is not None:
            self.uids[(namespace, name)] = str((raw.get("metadata") or {}).get("uid") or "")
        state = kueue.workload_state(raw) if raw is not None else None
        status = job.get("status") if isinstance(job.get("status"), dict) else {}
        assert isinstance(status, dict)
        flavors: dict[str, Obj] = {}
        if state is not None and state.phase is WorkloadPhase.ADMITTED and _may_create(status):
            for name in state.flavors:
                flavor = self._get_cluster(kueue.RESOURCE_FLAVOR_PLURAL, name)
                if flavor is not None:  # a missing one is named by the merge's error
                    flavors[name] = flavor
        priority, problem = None, foreign
        if foreign is None and (state is None or state.phase is WorkloadPhase.PENDING):
            priority, problem = self._priority(job)
        return QueueWorld(local_queue, raw, flavors, priority, problem)

    def get(self, namespace: str, name: str) -> Obj | None:
        try:
            return dict(
                call_json(
                    self.custom.get_namespaced_custom_object,
                    kueue.GROUP,
                    kueue.VERSION,
                    namespace,
                    kueue.WORKLOAD_PLURAL,
                    name,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _get_cluster(self, plural: str, name: str) -> Obj | None:
        try:
            return dict(
                call_json(
                    self.custom.get_cluster_custom_object, kueue.GROUP, kueue.VERSION, plural, name
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _priority(self, job: Mapping[str, Any]) -> tuple[int | None, str | None]:
        """The value of the job's priority class, or why it cannot be had."""
        try:
            model = load_job({k: job[k] for k in ("apiVersion", "kind", "metadata", "spec")})
        except (SpecError, KeyError):
            return None, None  # the state machine fails the job with the field errors
        ref = kueue.priority_class_ref(model)
        if ref is None:
            return None, None
        name = str(ref["name"])
        if ref["kind"] == "WorkloadPriorityClass":
            wpc = self._get_cluster("workloadpriorityclasses", name)
            if wpc is None:
                return None, (
                    f"metadata.labels: WorkloadPriorityClass {name} (label "
                    f"{kueue.LABEL_PRIORITY_CLASS}) does not exist; create it or fix the label"
                )
            return int(wpc.get("value") or 0), None
        try:
            pc = call_json(self.scheduling.read_priority_class, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None, (
                f"spec.priorityClassName: PriorityClass {name} does not exist; create it or "
                "fix the field"
            )
        return int(pc.get("value") or 0), None

    # --- writes
    def act(self, namespace: str, actions: WorkloadActions, now: datetime) -> None:
        """Perform one reconcile's Workload writes: replace, create, reset, conditions."""
        if actions.delete:
            self.delete(namespace, actions.delete)
        if actions.create:
            self._create(actions.create)
        if actions.adopt:
            self._adopt(namespace, actions.workload or "", actions.adopt)
        if actions.reset:
            self.reset(namespace, actions.reset, now)
        for cond in actions.conditions:
            self._apply_condition(namespace, actions.workload, cond)

    def delete(self, namespace: str, name: str, owner: str | None = None) -> None:
        """Delete the job's Workload: by the uid last observed as the job's, or (`owner`: the
        job's uid, once the job is gone) after checking its controller. 404 and 409 (the uid
        precondition failed: another object has the name now) are done."""
        uid = self.uids.pop((namespace, name), None)
        if owner is not None:
            raw = self.get(namespace, name)
            if raw is None or controller_uid(raw.get("metadata")) != owner:
                return  # gone, or not the deleted job's: not ours to delete
            uid = str((raw.get("metadata") or {}).get("uid") or "") or None
        if uid is None:
            log.warning("%s: not deleting Workload %s: not observed as the job's", namespace, name)
            return
        log.info("%s: deleting Workload %s", namespace, name)
        try:
            call(
                self.custom.delete_namespaced_custom_object,
                kueue.GROUP,
                kueue.VERSION,
                namespace,
                kueue.WORKLOAD_PLURAL,
                name,
                body={"propagationPolicy": "Background", "preconditions": {"uid": uid}},
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _create(self, workload: Obj) -> None:
        meta = workload["metadata"]
        try:
            call(
                self.custom.create_namespaced_custom_object,
                kueue.GROUP,
                kueue.VERSION,
                meta["namespace"],
                kueue.WORKLOAD_PLURAL,
                workload,
            )
            log.info("%s: created Workload %s", meta["namespace"], meta["name"])
        except ApiException as exc:
            if exc.status != 409:
                raise
            # Already there: ours only if its controller is the job (an object someone else
            # made under this name is a conflict the job shows, not a success).
            existing = self.get(meta["namespace"], meta["name"])
            owner = controller_uid(workload["metadata"])
            if existing is not None and controller_uid(existing.get("metadata")) != owner:
                raise ChildConflict(
                    f"Workload {meta['name']} already exists and is not this job's: the "
                    "operator does not modify, adopt or delete it. Delete it, or re-create "
                    "the job under another name"
                ) from None

    def _adopt(self, namespace: str, name: str, patch: Obj) -> None:
        """Take over a prebuilt Workload (a merge patch carrying its resourceVersion: a
        concurrent change makes it fail with 409, and the next reconcile looks again)."""
        try:
            call(
                self.custom.patch_namespaced_custom_object,
                kueue.GROUP,
                kueue.VERSION,
                namespace,
                kueue.WORKLOAD_PLURAL,
                name,
                patch,
                _content_type=MERGE_PATCH,
            )
            log.info("%s: took over Workload %s (made by MultiKueue)", namespace, name)
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(
                    f"{namespace}/{name}: the Workload changed while taken over"
                ) from None
            if exc.status != 404:
                raise

    def _patch_status(self, namespace: str, name: str, body: Obj, **kwargs: Any) -> None:
        call(
            self.custom.patch_namespaced_custom_object_status,
            kueue.GROUP,
            kueue.VERSION,
            namespace,
            kueue.WORKLOAD_PLURAL,
            name,
            body,
            **kwargs,
        )

    def _apply_condition(self, namespace: str, name: str, cond: Obj) -> None:
        """Server-side apply of one condition with its own field manager (Kueue owns the rest
        of the status). A Workload gone in the meantime needs nothing."""
        manager, body = kueue.condition_apply(
            {"metadata": {"name": name, "namespace": namespace}}, cond
        )
        try:
            self._patch_status(
                namespace, name, body, field_manager=manager, force=True, _content_type=APPLY_PATCH
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def reset(self, namespace: str, name: str, now: datetime) -> None:
        """The eviction reset (a JSON merge patch carrying the resourceVersion). Kueue writes
        the same status: on 409 read it again and retry, unless it is no longer evicted."""
        for _ in range(RESET_ATTEMPTS):
            raw = self.get(namespace, name)
            if raw is None or kueue.workload_state(raw).phase is not WorkloadPhase.EVICTED:
                return
            try:
                self._patch_status(
                    namespace, name, kueue.eviction_reset_patch(raw, now), _content_type=MERGE_PATCH
                )
                log.info("%s: Workload %s reset after its eviction", namespace, name)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise
        raise Conflict(f"{namespace}/{name}: the eviction reset kept conflicting with Kueue")

    # --- the watch
    def watchers(self, namespaces: list[str], wake: Callable[[str, str], None]) -> list[Watcher]:
        """Watches of our Workloads (labelled with the job's name): Kueue's admissions and
        evictions wake the job's loop at once, not at the next resync."""

        def handle(kind: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            job = (meta.get("labels") or {}).get(LABEL_JOB_NAME)
            if job and meta.get("namespace"):
                wake(meta["namespace"], job)

        def starter(namespace: str | None) -> Callable[[str | None], Any]:
            def start(version: str | None) -> Any:
                kw = Kube._watch_args(version, WATCH_SECONDS)
                kw["label_selector"] = LABEL_JOB_NAME
                args = (kueue.GROUP, kueue.VERSION)
                if namespace is None:
                    return self.custom.list_cluster_custom_object(
                        *args, kueue.WORKLOAD_PLURAL, **kw
                    )
                return self.custom.list_namespaced_custom_object(
                    *args, namespace, kueue.WORKLOAD_PLURAL, **kw
                )

            return start

        if not namespaces:
            return [Watcher("workloads", starter(None), handle)]
        return [Watcher(f"workloads/{ns}", starter(ns), handle) for ns in namespaces]


def _may_create(status: Mapping[str, Any]) -> bool:
    """Whether this reconcile may create pods, so the ResourceFlavors are needed: the job is
    (still) queued, or its current attempt has not been launched yet."""
    if status.get("phase") in (None, "Queued"):
        return True
    return bool(status.get("launchedAttempt") != status.get("restartAttempt"))
