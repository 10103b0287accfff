"""What a queued MegatronJob does with its Kueue Workload (pure): the decisions only.

A job labelled `kueue.x-k8s.io/queue-name` runs no pod until Kueue admits its Workload. The state
machine (`reconcile.py`) asks this module at three points:

- `gate`, before the job's pods are looked at: create the Workload, copy Kueue's words into the
  status and events, stop the pods after an eviction and hand the quota back once they are gone;
  True only while the Workload is admitted (then the ordinary machine runs the pods);
- `admitted_pods`, for the pods it is about to create: merged with the admission (flavors,
  podSetUpdates, the podset label, the TAS gate and annotations);
- `settle`, at the end of every reconcile: the Workload conditions to apply (PodsReady while it
  runs, Finished once the job Succeeded or finally Failed).

The Kueue data itself (names, the Workload, the merges, the patches) is `core/kueue.py`; the shell
(`cluster/workloads.py`) reads what `QueueWorld` holds and performs `WorkloadActions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from megatron_operator.api.job import MegatronJob
from megatron_operator.api.status import ConditionType, EventType, Phase, Reason
from megatron_operator.core import kueue
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.kueue import KueueError, QueuedState, WorkloadPhase
from megatron_operator.core.observe import PodView, controller_uid
from megatron_operator.core.planner import Plan
from megatron_operator.core.render import Pods

Obj = dict[str, Any]
C = ConditionType


@dataclass(frozen=True)
class QueueWorld:
    """What the shell read for a job that names a LocalQueue (`World.queue`)."""

    local_queue: str
    workload: Mapping[str, Any] | None  # the job's Workload as read back; None: there is none
    # The ResourceFlavors the admission names, by name (read only while pods may be created).
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    priority: int | None = None  # the value of the job's priority class, when it names one
    problem: str | None = None  # why no Workload can be made now (e.g. a missing priority class)


@dataclass
class WorkloadActions:
    """The Workload writes of one reconcile, in the order the shell performs them."""

    delete: str | None = None  # a stale Workload (podSets are immutable): replace it
    create: Obj | None = None
    adopt: Obj | None = None  # a merge patch making a prebuilt Workload (MultiKueue's) the job's
    reset: str | None = None  # the eviction reset of this Workload, once no pod is live
    conditions: list[Obj] = field(default_factory=list)  # each applied alone (PodsReady, Finished)
    workload: str = ""  # the Workload the conditions go to

    def __bool__(self) -> bool:
        return bool(self.delete or self.create or self.adopt or self.reset or self.conditions)


class Host(Protocol):
    """The parts of the state machine this module uses (reconcile._Machine)."""

    st: JobStatus

    def cond(self, type_: ConditionType, status: bool, reason: str, message: str = "") -> bool: ...

    def event(self, type_: EventType, reason: str, message: str) -> None: ...

    def delete(self, pods: list[PodView]) -> None: ...


def _condition(st: JobStatus, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in st.conditions if c.get("type") == type_), None)


class Queueing:
    """One reconcile's Kueue decisions for one queued job."""

    def __init__(
        self, world: QueueWorld, host: Host, now: datetime, uid: str | None = None
    ) -> None:
        self.q = world
        self.host = host
        self.now = now
        self.uid = uid  # the job's: only a Workload it controls (or takes over now) is written
        self.actions = WorkloadActions()
        self.state: QueuedState | None = (
            kueue.workload_state(world.workload) if world.workload is not None else None
        )
        self.nodes: int | None = None  # known once `gate` ran (the job is valid and active)

    @property
    def st(self) -> JobStatus:
        return self.host.st

    # --- before the pods ---------------------------------------------------------------------
    def gate(self, job: MegatronJob, p: Plan, pods: list[PodView]) -> bool:
        """True when the Workload is admitted: the pods may run. Otherwise the job is Queued,
        its pods are stopped, and the Workload is created, replaced or reset as needed."""
        st, state = self.st, self.state
        name = kueue.job_workload_name(job)
        st.workload = name
        st.local_queue = self.q.local_queue
        self.nodes = p.nodes
        if not self._prebuilt_usable(job, p, name, pods):
            return False
        if state is not None and state.phase is WorkloadPhase.ADMITTED:
            self._admitted(state, name)
            return True
        st.cluster_queue = None
        st.flavors = None
        self._enter_queue(job, p, name, state)
        self.host.delete(pods)  # with their grace period: the trainer checkpoints on SIGTERM
        live = any(x.active for x in pods)
        if state is None:
            self._create(job, p, name, live)
        elif state.phase is WorkloadPhase.EVICTED:
            if not live:
                self.actions.reset = name  # hands the quota back; Kueue may then re-admit it
        elif state.phase is WorkloadPhase.FINISHED and kueue.prebuilt_workload(job):
            self._waiting(Reason.QUEUED, f"Workload {name} was Finished by Kueue: {state.message}")
        elif state.phase is WorkloadPhase.FINISHED:
            # Finished before the job ended (a job revived after a fixed spec): a new one.
            self.actions.delete = name
            self._waiting(Reason.QUEUED, f"Workload {name} was Finished: replacing it")
        else:
            self._pending(job, p, name, state)
        return False

    def _prebuilt_usable(self, job: MegatronJob, p: Plan, name: str, pods: list[PodView]) -> bool:
        """A job MultiKueue copied to this worker cluster runs under the Workload MultiKueue made
        for it (a copy of the manager's): take it over, unless another object controls it or
        it does not match the job (then Finished/OutOfSync, and MultiKueue dispatches again).
        True when there is nothing in the way (or no prebuilt Workload at all)."""
        raw, state = self.q.workload, self.state
        prebuilt = kueue.prebuilt_workload(job)
        if prebuilt is None:
            return True
        # Whose it is comes first: never a write (adoption, OutOfSync) to another job's Workload.
        problem = kueue.prebuilt_name_problem(job.name, prebuilt)
        if problem is not None:
            self.host.delete(pods)
            self._waiting(Reason.QUEUED, problem, EventType.WARNING)
            return False
        if raw is None or state is None:
            return True
        if state.phase is WorkloadPhase.FINISHED:
            return True
        try:
            self.actions.adopt = kueue.adoption_patch(raw, job)
            self.actions.workload = name
        except KueueError as exc:
            self.host.delete(pods)
            self._waiting(Reason.QUEUED, str(exc), EventType.WARNING)
            return False
        stale = kueue.prebuilt_outdated(raw, job, p)
        if not stale:
            return True
        message = f"Workload {name} does not match the job ({', '.join(stale)})"
        self.actions.conditions.append(kueue.out_of_sync_condition(raw, message, self.now))
        self.actions.workload = name
        self.host.delete(pods)
        self._waiting(Reason.QUEUED, message, EventType.WARNING)
        return False

    def _enter_queue(self, job: MegatronJob, p: Plan, name: str, state: QueuedState | None) -> None:
        st = self.st
        if st.phase is None:
            st.phase = Phase.QUEUED
            self.host.event(
                EventType.NORMAL,
                Reason.CREATED,
                f"planned {p.layout_string()}: {p.nodes} pods, "
                f"queued in LocalQueue {self.q.local_queue}",
            )
            return
        if st.phase == Phase.QUEUED:
            return
        admitted = _condition(st, C.ADMITTED)
        was_admitted = admitted is not None and admitted.get("status") == "True"
        st.phase = Phase.QUEUED
        st.running_since = None
        st.restart_at = None
        # Pods of the next admission are a fresh attempt; an eviction is not a restart, so
        # neither restart count moves (maxRestarts is about failures, not preemption).
        st.next_gang()
        if not was_admitted:
            return
        if state is not None and state.phase is WorkloadPhase.EVICTED:
            why = f"Kueue evicted Workload {name} ({state.reason}): {state.message}"
        else:
            why = f"Workload {name} is no longer admitted"
        message = f"{why}; stopping the pods"
        self.host.cond(C.RUNNING, False, Reason.EVICTED, message)
        self.host.cond(C.RESTARTING, False, Reason.EVICTED, message)
        self.host.cond(C.ADMITTED, False, Reason.EVICTED, message)
        self.host.event(EventType.WARNING, Reason.EVICTED, message)

    def _admitted(self, state: QueuedState, name: str) -> None:
        st = self.st
        st.cluster_queue = state.cluster_queue
        st.flavors = list(state.flavors)
        if st.phase in (None, Phase.QUEUED):
            st.phase = Phase.PENDING
        flavors = ", ".join(state.flavors) or "-"
        message = (
            f"Workload {name} admitted by ClusterQueue {state.cluster_queue} (flavor {flavors})"
        )
        if self.host.cond(C.ADMITTED, True, Reason.ADMITTED, message):
            self.host.event(EventType.NORMAL, Reason.ADMITTED, message)

    def _create(self, job: MegatronJob, p: Plan, name: str, live: bool) -> None:
        if kueue.prebuilt_workload(job):  # MultiKueue makes it, before it copies the job here
            self._waiting(Reason.QUEUED, f"waiting for Workload {name}, which MultiKueue makes")
            return
        if self.q.problem:
            self._waiting(Reason.QUEUED, self.q.problem, EventType.WARNING)
            return
        try:
            workload = kueue.render_workload(job, p, self.q.priority)
        except KueueError as exc:
            self._waiting(Reason.QUEUED, str(exc), EventType.WARNING)
            return
        if not live:  # the protocol: a Workload only once no pod of the job is live
            self.actions.create = workload
        self._waiting(Reason.QUEUED, self._default_message(name))

    def _pending(self, job: MegatronJob, p: Plan, name: str, state: QueuedState) -> None:
        raw = self.q.workload
        assert raw is not None
        prebuilt = kueue.prebuilt_workload(job) is not None  # checked in _prebuilt_usable
        if state.phase is WorkloadPhase.PENDING and not self.q.problem and not prebuilt:
            try:
                desired = kueue.render_workload(job, p, self.q.priority)
            except KueueError:
                desired = None
            stale = kueue.workload_outdated(raw, desired) if desired is not None else []
            if stale:
                # podSets are immutable: replace it (it holds no quota while pending).
                self.actions.delete = name
                self._waiting(
                    Reason.QUEUED, f"the job changed ({', '.join(stale)}): replacing {name}"
                )
                return
        if not state.active:
            message = f"Workload {name} is deactivated (spec.active: false)"
        else:
            message = state.message or self._default_message(name)
        self._waiting(Reason.QUEUED, message)

    def _default_message(self, name: str) -> str:
        return f"Workload {name} waits in LocalQueue {self.q.local_queue} for Kueue"

    def _waiting(self, reason: Reason, message: str, kind: EventType = EventType.NORMAL) -> None:
        """Admitted=False with `message`, and an event whenever the message changes: the event
        stream tells why the job waits, in Kueue's own words."""
        before = _condition(self.st, C.ADMITTED)
        same = before is not None and before.get("message") == message
        self.host.cond(C.ADMITTED, False, reason, message)
        if not same:
            self.host.event(kind, reason, message)

    def suspended(self, pods: list[PodView]) -> None:
        """spec.suspend on a queued job: once its pods are gone, give the Workload (and any
        quota it holds) back; resuming queues the job again."""
        self.st.cluster_queue = None
        self.st.flavors = None
        if self.q.workload is not None and not any(x.active for x in pods):
            self.actions.delete = str((self.q.workload.get("metadata") or {}).get("name"))
        self.host.cond(C.ADMITTED, False, Reason.SUSPENDED, "spec.suspend is true")

    # --- the pods to create ------------------------------------------------------------------
    def admitted_pods(self, objs: Pods) -> Pods | None:
        """The rendered pods merged with the admission (as each is rendered). A flavor that
        contradicts the pods creates none of them (and says so; None): the job's nodeSelector
        must agree with it. What the merge reads (nodeSelector, tolerations, labels) is the same
        on every pod of the gang, so the first pod shows a conflict for all."""
        state = self.state
        if state is None or state.phase is not WorkloadPhase.ADMITTED:
            return objs
        flavors = self.q.flavors
        try:
            assignment = state.assignment(kueue.PODSET_TRAINER)
            updates = state.updates_for(assignment.name)
            tas = state.tas_for(assignment.name)

            def patch(o: Obj) -> Obj:
                return kueue.admission_pod_patch(o, assignment, flavors, updates, tas)

            if len(objs):
                patch(objs[0])
        except KueueError as exc:
            message = f"cannot create the admitted pods: {exc}"
            if self.host.cond(C.PODS_SCHEDULED, False, Reason.ADMISSION_CONFLICT, message):
                self.host.event(EventType.WARNING, Reason.ADMISSION_CONFLICT, message)
            return None
        return objs.patched(patch)

    # --- after everything --------------------------------------------------------------------
    def settle(self, pods: list[PodView], current: list[PodView]) -> WorkloadActions:
        """The Workload conditions this reconcile changes: Finished once the job ended, else
        PodsReady as Kueue's own job controller reports it, over the gang's `current` pods (an
        in-place restart keeps pods of older attempts)."""
        raw, state, st = self.q.workload, self.state, self.st
        if raw is None or state is None or state.phase is WorkloadPhase.FINISHED:
            return self.actions
        ours = controller_uid(raw.get("metadata")) == self.uid and self.uid is not None
        if not ours and self.actions.adopt is None:
            return self.actions  # not the job's (a prebuilt Workload of another): never written
        self.actions.workload = state.name
        if st.phase in (Phase.SUCCEEDED, Phase.FAILED):
            ended = _condition(st, str(st.phase))
            message = str((ended or {}).get("message") or f"the job {st.phase}")
            cond = kueue.finished_condition(raw, st.phase == Phase.SUCCEEDED, message, self.now)
            self.actions.conditions.append(cond)
            return self.actions
        if self.actions or self.nodes is None or state.phase is WorkloadPhase.EVICTED:
            return self.actions  # a reset or a replacement first; PodsReady next time
        cond = kueue.pods_ready_condition(raw, self._all_ready(current), self.now)
        previous = kueue.find_condition(raw, kueue.ConditionType.PODS_READY)
        if previous is None or (previous.get("status"), previous.get("reason")) != (
            cond["status"],
            cond["reason"],
        ):
            self.actions.conditions.append(cond)
        return self.actions

    def _all_ready(self, current: list[PodView]) -> bool:
        """Every pod of the gang is Ready (or has finished successfully), and no restart is in
        progress: during one, in place or not, the ranks are down though the pods may run."""
        if self.st.phase == Phase.RESTARTING:
            return False
        ready = [x for x in current if not x.deleting and (x.ready or x.phase == "Succeeded")]
        return self.nodes is not None and len(ready) == self.nodes
