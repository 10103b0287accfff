"""A MegatronJob that Kueue's MultiKueue runs on a worker cluster: the manager's side (pure).

With `spec.managedBy: kueue.x-k8s.io/multikueue`, the job's pods run on a worker cluster, never
here. Kueue's external-framework protocol (KEP-2349) leaves one thing to the job's controller on
the manager: the job's Workload, which MultiKueue copies to the workers (the first to admit it
wins). MultiKueue then copies the job there without `managedBy` (the worker's operator runs it
as an ordinary queued job, under that Workload copy) and mirrors the worker's whole `status`
back onto this job. So here the operator:

- creates no child and no pod, ever;
- keeps the Workload: creates it, replaces it while pending after a change, resets it after an
  eviction once the mirrored status shows no live pod, deletes it on `spec.suspend` (MultiKueue
  then removes the worker's copy), and reports `PodsReady` from the mirrored status (Kueue's
  waitForPodsReady evicts a Workload that never does);
- writes the job's status only until MultiKueue dispatches the Workload (`Queued` with Kueue's
  words, or `Failed` for an invalid spec); from then on the status is the worker's, mirrored, and
  the operator never writes it, so `kubectl get mj` here tells what the worker sees.

The worker's side (taking over the prebuilt Workload) is `queueing.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from megatron_operator.api import SpecError, load_job
from megatron_operator.api.status import ConditionType, EventType, Phase, Reason
from megatron_operator.core import kueue
from megatron_operator.core.conditions import set_condition
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.kueue import WorkloadPhase
from megatron_operator.core.observe import PodView, format_time, parse_time
from megatron_operator.core.planner import plan
from megatron_operator.core.queueing import Queueing, WorkloadActions
from megatron_operator.core.reconcile import Event, Outcome, Settings, World

C = ConditionType
# Mirrored phases in which the worker still has pods of the job.
LIVE_PHASES = frozenset({Phase.PENDING, Phase.RUNNING, Phase.RESTARTING})
NO_LABEL = (
    f"spec.managedBy is kueue.x-k8s.io/multikueue, but the job has no {kueue.LABEL_QUEUE_NAME} "
    "label: name a LocalQueue whose ClusterQueue uses the MultiKueue admission check"
)


def dispatched(workload: Mapping[str, Any]) -> bool:
    """Whether MultiKueue has placed the Workload on a worker (or it finished): from then on the
    job's status is the worker's. MultiKueue records the worker (`status.clusterName`) in the
    same write that makes its admission check Ready, before it first copies a status back."""
    status = workload.get("status") or {}
    return bool(status.get("clusterName")) or kueue.workload_state(workload).phase in (
        WorkloadPhase.ADMITTED,
        WorkloadPhase.FINISHED,
    )


@dataclass
class _Host:
    """What `Queueing` needs from the state machine, for a job with no pods here."""

    st: JobStatus
    now: datetime
    generation: int | None
    events: list[Event] = field(default_factory=list)

    def cond(self, type_: ConditionType, status: bool, reason: str, message: str = "") -> bool:
        return set_condition(
            self.st.conditions, type_, status, reason, message, self.now, self.generation
        )

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def delete(self, pods: list[PodView]) -> None:
        """Nothing to delete: the job's pods are on the worker."""


def reconcile_dispatched(world: World, settings: Settings | None = None) -> Outcome:
    """One reconcile of a MultiKueue job on the manager cluster. `Outcome.status` is the job's
    status unchanged once it is dispatched (the shell then writes nothing)."""
    settings = settings or Settings()
    raw_status = world.job.get("status")
    unchanged = dict(raw_status) if isinstance(raw_status, Mapping) else {}
    out = Outcome(status=unchanged, requeue_after=settings.resync_seconds)
    q = world.queue
    if q is not None and q.workload is not None and dispatched(q.workload):
        actions = _follow(world, q.workload)
        out.workload = actions or None
        _ttl(world, out)
        return out
    meta = world.job.get("metadata") or {}
    host = _Host(JobStatus.read(raw_status), world.now, meta.get("generation"))
    st = host.st
    try:
        job = load_job({k: world.job[k] for k in ("apiVersion", "kind", "metadata", "spec")})
        p = plan(job.spec)
    except (SpecError, KeyError) as exc:
        errors = exc.errors if isinstance(exc, SpecError) else []
        message = ("; ".join(str(e) for e in errors) or f"missing {exc}")[:4000]
        if st.phase != Phase.FAILED:
            st.phase = Phase.FAILED
            st.completion_time = format_time(world.now)
            host.cond(C.FAILED, True, Reason.INVALID_SPEC, message)
            host.event(EventType.WARNING, Reason.INVALID_SPEC, message)
        st.observed_generation = host.generation
        out.status, out.events = st.to_raw(), host.events
        return out
    st.observed_generation = host.generation
    st.layout, st.gpus, st.world_size = p.layout_string(), p.gpus, p.world_size
    if q is None:
        st.phase = Phase.QUEUED
        if host.cond(C.ADMITTED, False, Reason.QUEUED, NO_LABEL):
            host.event(EventType.WARNING, Reason.QUEUED, NO_LABEL)
    else:
        queueing = Queueing(q, host, world.now, meta.get("uid"))
        if job.spec.suspend:
            queueing.suspended([])
            if st.phase != Phase.SUSPENDED:
                st.phase = Phase.SUSPENDED
                host.event(EventType.NORMAL, Reason.SUSPENDED, "spec.suspend is true")
            host.cond(C.SUSPENDED, True, Reason.SUSPENDED, "spec.suspend is true")
        else:
            if st.phase == Phase.SUSPENDED:
                host.cond(C.SUSPENDED, False, Reason.RESUMED, "spec.suspend is false")
            queueing.gate(job, p, [])
        out.workload = queueing.actions or None
    out.status, out.events = st.to_raw(), host.events
    return out


def _follow(world: World, raw: Mapping[str, Any]) -> WorkloadActions:
    """The Workload writes for a dispatched job, read from the mirrored status."""
    state = kueue.workload_state(raw)
    actions = WorkloadActions(workload=state.name)
    mirrored = JobStatus.read(world.job.get("status"))
    spec = world.job.get("spec")
    if isinstance(spec, Mapping) and spec.get("suspend") is True:
        if state.phase is not WorkloadPhase.FINISHED:
            actions.delete = state.name  # frees the quota; MultiKueue removes the worker's copy
        return actions
    if state.phase is WorkloadPhase.EVICTED:
        if mirrored.phase not in LIVE_PHASES:  # the worker stopped the pods (it checkpointed)
            actions.reset = state.name
        return actions
    if state.phase is WorkloadPhase.ADMITTED:
        ready = mirrored.phase in (Phase.RUNNING, Phase.SUCCEEDED)
        cond = kueue.pods_ready_condition(raw, ready, world.now)
        previous = kueue.find_condition(raw, kueue.ConditionType.PODS_READY)
        if previous is None or (previous.get("status"), previous.get("reason")) != (
            cond["status"],
            cond["reason"],
        ):
            actions.conditions.append(cond)
    return actions


def _ttl(world: World, out: Outcome) -> None:
    """spec.ttlSecondsAfterFinished, from the mirrored completion: the worker's copy is gone by
    then (MultiKueue removes it when the job ends), so the manager's job is the one to delete."""
    spec = world.job.get("spec")
    ttl = spec.get("ttlSecondsAfterFinished") if isinstance(spec, Mapping) else None
    mirrored = JobStatus.read(world.job.get("status"))
    done_at = parse_time(mirrored.completion_time)
    if not isinstance(ttl, int) or isinstance(ttl, bool) or done_at is None:
        return
    if mirrored.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        return
    expiry = done_at + timedelta(seconds=ttl)
    if world.now >= expiry:
        out.delete_job = True
    else:
        wait = (expiry - world.now).total_seconds() + 0.05
        out.requeue_after = min(out.requeue_after, wait)
