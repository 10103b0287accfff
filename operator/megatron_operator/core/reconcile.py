"""The job's state machine (pure): what the operator sees → the next status and what to do.

Level-triggered: every call starts from a fresh observation (the job, its pods, node readiness),
so an operator killed at any point converges when it starts again. The shell applies an Outcome
in a fixed order, which is what makes that true:

1. write the status (one write per reconcile);
2. emit the events (only after the write succeeded);
3. delete pods, then create the objects in `Outcome.create` (children first, then pods).

A restart is therefore recorded (attempt N+1, restarts+1) *before* any pod of attempt N is
deleted, and pods are created only for an attempt the status already names: a crash between
steps repeats no restart and leaves no pod behind.

Each attempt's pods are distinct objects (`<job>-a<attempt>-<rank>`, hostname `<job>-<rank>`);
the next attempt's pods are created only once every pod of the older ones is gone, so the stable
DNS name behind MASTER_ADDR names one pod at a time. Only pods controlled by this job (by the
uid of their controller ownerReference) count: a foreign pod is neither counted nor deleted.
Lifecycle of an attempt: Pending (creating, scheduling) → Running (every pod Running) → Succeeded (every pod
exited 0) | a failure → Restarting (old pods deleted, then a capped exponential backoff) → the
next attempt, or Failed when the failure rules or maxRestarts say so.

The same machine drives `mjob run --local`, over process groups instead of pods.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from megatron_contract.ladder import Report
from megatron_operator.api import FieldError, MegatronJob, MegatronJobSpec, SpecError, load_job
from megatron_operator.api.status import ConditionType, EventType, Phase, Reason, Rung
from megatron_operator.api.transitions import check_update
from megatron_operator.core import accounting, churn, ladder, spares, tiers
from megatron_operator.core import defaults as job_defaults
from megatron_operator.core.conditions import reason_of, set_condition, since
from megatron_operator.core.failures import (
    Nodes,
    attempt_report,
    classify,
    node_lost,
    startup_problem,
    startup_timeout,
)
from megatron_operator.core.jobstatus import BadJobData, JobStatus, shift
from megatron_operator.core.kueue import LABEL_QUEUE_NAME, queue_name
from megatron_operator.core.names import MASTER_NODE_RANK, pod_name
from megatron_operator.core.observe import LeaseView, PodView, Progress, format_time, parse_time
from megatron_operator.core.planner import Plan, plan
from megatron_operator.core.policy import (
    UNCOUNTED_WINDOW_SECONDS,
    Failure,
    backoff_seconds,
    decide,
    first_failure,
)
from megatron_operator.core.queueing import Queueing, QueueWorld, WorkloadActions
from megatron_operator.core.render import Pods, children, recorded_spec

Obj = dict[str, Any]
C = ConditionType
CONFLICT_RETRY_SECONDS = 15.0
REJECTED = "the apiserver rejected the pods rendered from it:"  # look again for the conflicting object to be gone
CLOCK_SKEW_SECONDS = 60.0  # how far ahead of ours a pod's clock may be
OWN_NAMESPACE = (
    "{} is the operator's own namespace: it holds the operator's keys (the claim seal, the "
    "metrics TLS key), which a job's pods could mount; create the job in a namespace the "
    "operator watches for jobs"
)


@dataclass(frozen=True)
class Settings:
    node_lost_grace_seconds: float = 30.0  # NotReady this long = the node is lost
    resync_seconds: float = 60.0  # reconcile at least this often
    network_policy: bool = False  # render the per-job NetworkPolicy (--network-policy)
    # The operator runs without Kueue: a job naming a LocalQueue waits, never runs outside
    # its quota (the shell's --kueue off, or auto without Kueue).
    without_kueue: bool = False
    require_queue: bool = False  # a job must name a LocalQueue (--require-queue-label)
    # The operator's own namespace ($POD_NAMESPACE): its keys live there, so it takes no job.
    own_namespace: str | None = None


@dataclass(frozen=True)
class World:
    """One observation of a job and everything it depends on."""

    job: Mapping[str, Any]  # the raw MegatronJob (metadata, spec, status)
    pods: list[PodView]
    now: datetime
    not_ready_nodes: Mapping[str, datetime] = field(default_factory=dict)  # name → since
    known_nodes: frozenset[str] | None = None  # None: not known, skip the missing-node check
    accepted_spec: Mapping[str, Any] | None = None  # the spec the current attempt runs
    # The apiserver refused the objects rendered from this spec (a 422), with its message.
    rejection: str | None = None
    # The apiserver's message while it keeps refusing the job's objects (403, throttling, 5xx);
    # the shell keeps it until a creation goes through.
    refusal: str | None = None
    # An object with one of the job's child names exists and is not the job's (kind/name and
    # whose): nothing is created, and the job says so (core/ownership.py decides).
    conflict: str | None = None
    lease: LeaseView | None = None  # rank 0's progress Lease (None: not there yet)
    # No progress copy into the status before this time (the shell's per-job rate limit: each
    # copy is a full status write, and the trainer's pod decides how often the Lease changes).
    progress_not_before: datetime | None = None
    # The job names a Kueue LocalQueue (and the operator runs with Kueue): its Workload.
    queue: QueueWorld | None = None
    # The platform's defaults in the job's scope (core/defaults.py), least specific first; the
    # shell looks them up only for a job that has not recorded its own yet (status.defaults).
    defaults: tuple[job_defaults.Layer, ...] | None = None


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    delete_uids: dict[str, str] = field(default_factory=dict)  # pod name → uid (a precondition)
    # Pods already being deleted on a lost node: only a delete with no grace period removes them
    # (their kubelet is gone), and the next attempt waits for them.
    force_delete: list[str] = field(default_factory=list)
    # Objects to create, in order: the job's other children (get-or-create), then its pods,
    # which are rendered one at a time as the create calls read them (core/render.Pods).
    create: list[Obj] = field(default_factory=list)
    pods: Pods | None = None
    delete_job: bool = False
    requeue_after: float = 60.0
    restart_reason: str | None = None  # for the restarts_total metric
    restart_rung: Rung | None = None  # and its rung
    entered_running: bool = False
    workload: WorkloadActions | None = None  # Kueue Workload writes (queued jobs only)

    @property
    def create_pods(self) -> Sequence[Obj]:
        return self.pods if self.pods is not None else []


def _strip(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in doc}


def _validate(
    world: World,
    phase: Phase | None,
    defaults: Mapping[str, Any] | None = None,
    own_namespace: str | None = None,
) -> tuple[MegatronJob | None, Plan | None, list[FieldError]]:
    doc = _strip(world.job)
    if defaults and isinstance(doc.get("spec"), Mapping):
        doc["spec"] = job_defaults.apply(doc["spec"], defaults)
    try:
        job = load_job(doc)
        p = plan(job.spec)
    except SpecError as exc:
        return None, None, exc.errors
    if own_namespace is not None and job.namespace == own_namespace:
        return None, None, [FieldError("metadata.namespace", OWN_NAMESPACE.format(own_namespace))]
    if world.accepted_spec is not None:
        try:
            old = MegatronJobSpec.model_validate(dict(world.accepted_spec))
        except ValueError:
            old = None  # an unreadable record is not the user's fault: accept the new spec
        if old is not None:
            # Compared as recorded (spec.env values as digests), or as an older operator
            # recorded it (the values themselves).
            suspended = phase == Phase.SUSPENDED
            errors = check_update(old, recorded_spec(job.spec), suspended=suspended) and (
                check_update(old, job.spec, suspended=suspended)
            )
            if errors:
                return None, None, errors
    return job, p, []


class _Machine:
    """One reconcile: reads `world`, changes a copy of the status, collects actions."""

    def __init__(self, world: World, settings: Settings) -> None:
        self.w = world
        self.s = settings
        self.now = world.now
        meta = world.job.get("metadata") or {}
        self.uid: str | None = meta.get("uid")
        self.generation: int | None = meta.get("generation")
        self.st = JobStatus.read(world.job.get("status"))
        self.out = Outcome(status={}, requeue_after=settings.resync_seconds)
        self.deadlines: list[datetime] = []
        self.nodes = Nodes(
            world.not_ready_nodes, world.known_nodes, settings.node_lost_grace_seconds
        )
        # Only the job's own pods: a foreign pod with our label is never counted or deleted.
        self.pods = [p for p in world.pods if self.mine(p)]
        uid = (world.job.get("metadata") or {}).get("uid")
        self.queue = (
            Queueing(world.queue, self, world.now, uid) if world.queue is not None else None
        )
        # Finished, or suspended with every pod gone: nothing happens until the job changes, so
        # no resync either (only its deadlines, e.g. the TTL). The shell ends the job's loop.
        self.quiet = False
        self.current: list[PodView] = []  # the gang's pods, once `active` sorted them
        self.spares: list[PodView] = []  # its idle spare pods (resources.spareNodes)
        self.spare_nodes = 0  # resources.spareNodes, once the job is valid
        self.platform = job_defaults.Platform()  # what only the defaults say (render.py)

    # --- helpers
    def cond(self, type_: ConditionType, status: bool, reason: str, message: str = "") -> bool:
        return set_condition(
            self.st.conditions, type_, status, reason, message, self.now, self.generation
        )

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.out.events.append(Event(type_, reason, message))

    def delete(self, pods: list[PodView]) -> None:
        """Delete with the pods' grace period. A pod whose delete cannot finish because its node
        is lost (no kubelet to stop the container and confirm) is force-deleted, as `kubectl
        delete --force` would: its process cannot save a checkpoint anyway, and a partitioned
        one can no longer reach its peers, which this attempt's delete has stopped."""
        for p in pods:
            if self.kept(p):
                continue
            if p.deleting and not node_lost(p.node, self.nodes, self.now):
                since = self.nodes.not_ready.get(p.node or "")
                if since is not None:  # look again when the node counts as lost
                    grace = timedelta(seconds=self.nodes.lost_grace_seconds)
                    self.deadlines.append(since + grace)
                continue
            if p.deleting:
                if p.name in self.out.force_delete:
                    continue
                self.out.force_delete.append(p.name)
                self.event(
                    EventType.WARNING,
                    Reason.FORCE_DELETED,
                    f"pod {p.name} on lost node {p.node}: deleted without a grace period",
                )
            else:
                self.out.delete_pods.append(p.name)
            if p.uid:
                self.out.delete_uids[p.name] = p.uid

    def kept(self, p: PodView) -> bool:
        """A failed pod kept for its logs (restartPolicy.keepFailedPods): it holds nothing."""
        return p.name in (self.st.kept_pods or []) and p.failed

    def keep(self, job: MegatronJob, failures: list[Failure], current: list[PodView]) -> None:
        """Keep the failed attempt's first Failed pod (the cause's when it has one), dropping
        the oldest kept pod past keepFailedPods; the next delete removes that one."""
        limit = job.spec.restart_policy.keep_failed_pods
        cause = first_failure(failures)
        order = sorted(failures, key=lambda f: (f is not cause, f.pod or ""))
        by_name = {x.name: x for x in current}
        for f in order:
            x = by_name.get(f.pod or "")
            if limit > 0 and x is not None and x.failed:
                before = self.st.kept_pods or []
                kept = [n for n in before if n != x.name]
                self.st.kept_pods = [*kept, x.name][-limit:]
                # A pod past the limit is kept no more: delete it now (it may be of an older
                # attempt, which no other delete of this restart reaches).
                dropped = set(before) - set(self.st.kept_pods)
                self.delete([p for p in self.pods if p.name in dropped])
                return
        if limit == 0:
            self.st.kept_pods = None

    def mine(self, p: PodView) -> bool:
        """Controlled by this job: the controller ownerReference names its uid. Without a uid
        (`mjob run --local`, tests) every pod handed in is the job's."""
        return self.uid is None or p.owner_uid == self.uid

    def finish(self, phase: Phase, reason: str, message: str) -> None:
        self.st.phase = phase
        self.st.completion_time = format_time(self.now)
        self.st.restart_at = None
        self.cond(C.RUNNING, False, reason, message)
        self.cond(C.RESTARTING, False, reason, message)
        self.cond(C(phase.value), True, reason, message)
        kind = EventType.NORMAL if phase == Phase.SUCCEEDED else EventType.WARNING
        self.event(kind, reason, message)

    # --- the steps
    def resolve_defaults(self) -> list[FieldError]:
        """Record the platform's defaults once, before the job first starts (status.defaults):
        a later change of them never reaches a running job's next attempt."""
        if self.st.defaults is not None or self.st.start_time is not None:
            return []
        if self.w.defaults is None:
            return []  # not looked up
        record, errors = job_defaults.resolve(self.w.defaults)
        if not errors:
            # Recorded even when empty: the shell then looks no more.
            self.st.defaults = record if record is not None else {"sources": []}
        return errors

    def run(self) -> Outcome:
        judged = self.st.observed_generation  # the spec generation the status speaks of
        problems = self.resolve_defaults()
        merged = job_defaults.recorded_spec(self.st.defaults)
        self.platform = job_defaults.platform(merged)
        job, p, errors = _validate(self.w, self.st.phase, merged, self.s.own_namespace)
        if problems:
            job, p, errors = None, None, problems
        if self.w.rejection is not None:
            errors = [FieldError("spec", f"{REJECTED} {self.w.rejection}")]
            # The apiserver's own words, as for any refusal (a template's field it validates).
            self.cond(C.CREATE_FAILURE, True, Reason.FAILED_CREATE, self.w.rejection[:1000])
        if job is None or p is None or errors:
            self.invalid(errors)
            return self.done()
        if self.rejected() and judged == self.generation:
            # The same spec renders the same pods, which the apiserver refused: the job stays
            # Failed, its CreateFailure condition with the apiserver's words, until the spec
            # changes (not a create, a refusal and a revival every resync).
            self.terminal(job, Phase.FAILED)
            return self.done()
        self.st.observed_generation = self.generation
        self.refused()
        self.st.layout = p.layout_string()
        self.st.parallelism = p.status_parallelism()
        self.st.gpus = p.gpus
        self.st.world_size = p.world_size
        if (
            self.st.phase == Phase.FAILED
            and reason_of(self.st.conditions, C.FAILED) == Reason.INVALID_SPEC
        ):
            self.revive()  # the spec was fixed
        if self.st.phase in (Phase.SUCCEEDED, Phase.FAILED):
            self.terminal(job, self.st.phase)
            return self.done()
        if self.past_deadline(job):
            return self.done()
        if job.spec.suspend:
            self.suspend()
            if self.queue is not None:
                self.queue.suspended(self.w.pods)
            return self.done()
        if self.st.phase == Phase.SUSPENDED:
            self.resume(job)
        if self.queue is None and self.held(job):
            return self.done()
        if self.queue is not None and not self.queue.gate(job, p, self.w.pods):
            return self.done()  # Queued: no pod runs until Kueue admits the Workload
        self.active(job, p)
        if self.st.phase in (Phase.SUCCEEDED, Phase.FAILED):
            self.copy_progress(job, final=True)  # the last steps, even inside the copy limit
            self.ttl(job)  # it just finished: schedule the TTL now, not at the next resync
        return self.done()

    def held(self, job: MegatronJob) -> bool:
        """A job that may not start here: it names a LocalQueue while the operator runs without
        Kueue (running it would bypass the queue's quota), or it names none where the operator
        requires one. It waits in phase Queued, its Admitted condition saying why, until its
        label changes. A job that has started already is never stopped for it."""
        queue = queue_name(job)
        why: tuple[str, str] | None = None
        if queue is not None and self.s.without_kueue:
            why = (
                Reason.QUEUE_UNAVAILABLE,
                f"the job names the LocalQueue {queue} (label {LABEL_QUEUE_NAME}), but this "
                "operator runs without Kueue (the chart's kueue.enabled=false): it waits rather "
                "than run outside the queue's quota; turn the integration on, or remove the "
                "label to run it unqueued",
            )
        elif queue is None and self.s.require_queue:
            why = (
                Reason.NO_QUEUE,
                f"this cluster runs jobs through Kueue only: add the label {LABEL_QUEUE_NAME} "
                "naming your team's LocalQueue (kubectl get localqueues)",
            )
        if self.st.start_time is not None and self.st.phase != Phase.QUEUED:
            why = None  # started already: not stopped for it
        held = self.st.phase == Phase.QUEUED and reason_of(self.st.conditions, C.ADMITTED) in (
            Reason.QUEUE_UNAVAILABLE,
            Reason.NO_QUEUE,
        )
        if why is None:
            if held:  # released: it starts as a new job would
                self.st.phase = None
                self.st.conditions = [c for c in self.st.conditions if c.get("type") != C.ADMITTED]
            return False
        reason, message = why
        self.st.phase = Phase.QUEUED
        if self.cond(C.ADMITTED, False, reason, message):
            self.event(EventType.WARNING, reason, message)
        self.delete(self.pods)
        self.quiet = not self.pods
        return True

    def past_deadline(self, job: MegatronJob) -> bool:
        """spec.activeDeadlineSeconds since status.startTime: past it the job fails, and its
        pods are deleted with their grace period (the trainer checkpoints on SIGTERM)."""
        limit = job.spec.active_deadline_seconds
        started = parse_time(self.st.start_time)
        if limit is None or started is None:
            return False
        end = shift(started, limit, "status.startTime")
        if self.now < end:
            self.deadlines.append(end)
            return False
        self.finish(
            Phase.FAILED,
            Reason.DEADLINE_EXCEEDED,
            f"spec.activeDeadlineSeconds ({limit} s) passed: the job started at "
            f"{self.st.start_time}; its pods are stopped",
        )
        self.terminal(job, Phase.FAILED)
        return True

    def rejected(self) -> bool:
        """Failed because the apiserver refused the pods the spec renders (a 422)."""
        failed = next((c for c in self.st.conditions if c.get("type") == C.FAILED), {})
        return (
            self.st.phase == Phase.FAILED
            and failed.get("reason") == Reason.INVALID_SPEC
            and str(failed.get("message", "")).startswith(f"spec: {REJECTED}")
        )

    def refused(self) -> None:
        """Show the apiserver's refusal on the job, and clear it once creation goes through."""
        refusal = self.w.refusal
        if refusal is not None:
            before = next(
                (c.get("message") for c in self.st.conditions if c.get("type") == C.CREATE_FAILURE),
                None,
            )
            self.cond(C.CREATE_FAILURE, True, Reason.FAILED_CREATE, refusal)
            if before != refusal:
                self.event(EventType.WARNING, Reason.FAILED_CREATE, refusal)
        elif reason_of(self.st.conditions, C.CREATE_FAILURE) == Reason.FAILED_CREATE:
            self.cond(C.CREATE_FAILURE, False, Reason.CREATED, "the apiserver accepted the objects")

    def invalid(self, errors: list[FieldError]) -> None:
        message = "; ".join(str(e) for e in errors)[:4000]
        already = (
            self.st.phase == Phase.FAILED
            and reason_of(self.st.conditions, C.FAILED) == Reason.INVALID_SPEC
            and self.st.observed_generation == self.generation
        )
        self.st.observed_generation = self.generation
        if not already:
            self.finish(Phase.FAILED, Reason.INVALID_SPEC, message)
        self.delete(self.pods)

    def revive(self) -> None:
        self.st.phase = Phase.PENDING
        self.st.next_gang()
        self.st.completion_time = None
        self.cond(C.FAILED, False, Reason.SPEC_FIXED, "the spec is valid again")
        self.event(EventType.NORMAL, Reason.SPEC_FIXED, "the spec is valid again: starting")

    def terminal(self, job: MegatronJob, phase: Phase) -> None:
        # Nothing may hold a GPU after the end; failed jobs also drop their finished pods. A
        # pod whose containers have all exited holds nothing even while its phase still says
        # Running (the kubelet turns it once the pod is torn down): a succeeded job keeps it,
        # and its log.
        doomed = (
            self.pods
            if phase == Phase.FAILED
            else [p for p in self.pods if p.active and not p.containers_done]
        )
        self.delete(doomed)
        self.ttl(job)
        self.quiet = True

    def ttl(self, job: MegatronJob) -> None:
        ttl = job.spec.ttl_seconds_after_finished
        done_at = parse_time(self.st.completion_time)
        if ttl is not None and done_at is not None:
            expiry = shift(done_at, ttl, "status.completionTime")
            if self.now >= expiry:
                self.out.delete_job = True
            else:
                self.deadlines.append(expiry)

    def suspend(self) -> None:
        self.delete(self.pods)
        left = len([x for x in self.pods if not self.kept(x)])
        message = f"waiting for {left} pods to stop" if left else "all pods stopped"
        if self.st.phase != Phase.SUSPENDED:
            self.st.phase = Phase.SUSPENDED
            self.st.restart_at = None
            self.st.running_since = None
            self.cond(C.RUNNING, False, Reason.SUSPENDED, "spec.suspend is true")
            self.cond(C.RESTARTING, False, Reason.SUSPENDED, "spec.suspend is true")
            self.event(
                EventType.NORMAL, Reason.SUSPENDED, "spec.suspend is true: stopping the pods"
            )
        self.cond(C.SUSPENDED, True, Reason.SUSPENDED, message)
        queued = self.w.queue is not None and self.w.queue.workload is not None
        self.quiet = not self.pods and not queued

    def resume(self, job: MegatronJob) -> None:
        # A fresh attempt (not a restart): pods of the suspended attempt may still be stopping.
        # It counts toward the operator's floor and, from the second of the hour, follows the
        # job's backoff (core/churn.py): toggling spec.suspend must not churn gangs.
        attempts = churn.recent(self.st.attempt_times, self.now)
        resumes = churn.recent(self.st.resume_times, self.now)
        wait = churn.resume_seconds(job.spec.restart_policy, len(attempts), len(resumes))
        stamp = format_time(self.now)
        self.st.attempt_times = churn.recent([*attempts, stamp], self.now)
        self.st.resume_times = churn.recent([*resumes, stamp], self.now)
        self.st.restart_at = format_time(self.now + timedelta(seconds=wait))
        self.st.next_gang()
        self.st.phase = Phase.PENDING
        self.cond(C.SUSPENDED, False, Reason.RESUMED, "spec.suspend is false")
        self.event(
            EventType.NORMAL, Reason.RESUMED, "spec.suspend is false: starting a new attempt"
        )

    def active(self, job: MegatronJob, p: Plan) -> None:
        n = self.st.restart_attempt
        if self.st.phase is None:
            self.st.phase = Phase.PENDING
            self.event(
                EventType.NORMAL, Reason.CREATED, f"planned {p.layout_string()}: {p.nodes} pods"
            )
        # Set before any child exists: the delete handler skips jobs that never started.
        if self.st.start_time is None:
            self.st.start_time = format_time(self.now)
        # The gang's pods (kept across in-place restarts), its spares, and the stale ones of
        # older gangs. A pod whose node rank moved onto a spare is deleted, never waited for.
        self.spare_nodes = job.spec.resources.spare_nodes
        if self.spare_nodes:
            # The Node's Ready condition, as a second signal beside the launchers' heartbeat:
            # with a spare to move onto, a pod on a NotReady node is lost at once (the node
            # controller has already waited out its own grace period), since its launcher
            # fences itself, or is told to leave, before its rank runs anywhere else.
            self.nodes = replace(
                self.nodes,
                lost_grace_seconds=min(self.nodes.lost_grace_seconds, spares.NOT_READY_SECONDS),
            )
        gang = spares.sort_gang(
            self.pods, self.st.gang, n, p.nodes, self.spare_nodes, self.st.swapped()
        )
        current, stale = gang.current, gang.stale
        self.current, self.spares = current, gang.spares
        self.delete(stale)
        self.delete(gang.displaced)
        self.follow_coordinator()
        self.tend_spares()
        self.copy_progress(job)

        if self.st.phase == Phase.RESTARTING and not self.restart_wait_over(job, current, stale):
            return
        if self.st.phase == Phase.PENDING and self.resume_held():
            return
        self.create_missing(job, p, n, current, stale)
        if self.w.conflict is not None:
            self.blocked(self.w.conflict)
        failures = self.failures(job, p, n, current)
        if failures:
            self.fail_or_restart(job, failures, current)
            return
        self.advance(p, n, current)
        self.replenish(job, p, n)

    # --- spare nodes (core/spares.py)
    def follow_coordinator(self) -> None:
        """Record the coordinator that moved off node rank 0's pod (its report, with a majority
        of the launchers behind it, says so): later pods are told where it is."""
        if not self.spare_nodes:
            return
        report = self.w.lease.report if self.w.lease is not None else None
        pod = spares.coordinator_pod(report, self.st.coordinator)
        if report is None or pod is None or pod != report.coordinator:
            return
        record = {"pod": pod, "term": report.term}
        if self.st.coordinator != record:
            self.st.coordinator = record
            self.event(
                EventType.NORMAL,
                Reason.COORDINATOR_MOVED,
                f"the launchers' coordinator moved to pod {pod} (term {report.term})",
            )

    def coordinator_address(self) -> str | None:
        """Where the coordinator listens once it moved: its pod's IP (new pods dial it)."""
        pod = (self.st.coordinator or {}).get("pod")
        found = next((x for x in self.pods if x.name == pod), None) if pod else None
        return found.ip if found is not None else None

    def tend_spares(self) -> None:
        """A spare that failed, was evicted or sits on a lost node is deleted (made again by
        `replenish`): it held no rank, so nothing restarts."""
        if not self.spare_nodes:
            return
        broken = []
        for x in self.spares:
            failure, look_again = classify(x, self.nodes, self.now)
            if look_again is not None:
                self.deadlines.append(look_again)
            if failure is not None or x.succeeded:
                broken.append(x)
                if not x.deleting:
                    self.event(
                        EventType.WARNING,
                        Reason.SPARE_LOST,
                        f"spare pod {x.name} is lost ({failure.message if failure else 'it exited'}): "
                        "it will be made again",
                    )
        # Still listed until gone: its number is made again only then (the same name).
        self.delete(broken)
        self.st.ready_spares = len(self.ready_spares())

    def ready_spares(self) -> list[PodView]:
        return spares.ready(self.spares, self.report())

    def replenish(self, job: MegatronJob, p: Plan, n: int) -> None:
        """Make the missing spares once the attempt trains (or has run a while): in the
        background, never on the way from a lost node to the next attempt."""
        if not self.spare_nodes or self.out.pods is not None or self.st.phase != Phase.RUNNING:
            return
        if self.st.launched_attempt != n or self.w.conflict is not None:
            return
        since = parse_time(self.st.running_since)
        settled = since is not None and self.now >= since + timedelta(
            seconds=spares.REPLENISH_AFTER_SECONDS
        )
        # The Lease, not status.progress: attempt 0's records are copied at most once per
        # rate-limit window, and a short job could end before its first copy.
        if not (self.stepped() or self.lease() is not None or settled):
            if since is not None:
                self.deadlines.append(since + timedelta(seconds=spares.REPLENISH_AFTER_SECONDS))
            return
        gang = spares.Gang(current=self.current, spares=self.spares)
        numbers = spares.missing(gang, self.spare_nodes)
        if not numbers:
            return
        made: Pods | None = Pods(
            job,
            p,
            [p.nodes + i for i in numbers],
            n,
            platform=self.platform,
            coordinator=self.coordinator_address(),
        )
        if self.queue is not None and made is not None:
            made = self.queue.admitted_pods(made)
        if made:
            self.out.pods = made

    def resume_held(self) -> bool:
        """A resumed job waits until status.restartAt (core/churn.py) before its new gang."""
        start = parse_time(self.st.restart_at)
        if start is None:
            return False
        if self.now < start:
            self.deadlines.append(start)
            return True
        self.st.restart_at = None
        return False

    def restart_wait_over(
        self, job: MegatronJob, current: list[PodView], stale: list[PodView]
    ) -> bool:
        """Between a restart's decision and its release: replace what was lost meanwhile, wait
        for the stale pods to go, then for the backoff; True once the attempt is released (the
        launchers then start its ranks, and missing pods are created)."""
        lost = self.lost_pods(current)
        if lost:
            self.absorb(job, lost, current)
            return False
        if any(not self.kept(x) for x in stale):
            return False  # step 2: wait until every pod of the failed gang is gone (but the kept)
        start = parse_time(self.st.restart_at)
        if start is None:
            # The job's backoff, and for a new gang the operator's floor over the gangs it
            # creates (core/churn.py). A lower rung creates at most the lost pods, and an
            # attempt of it that fails before its first step recreates the gang: the floor
            # would only hold its kept launchers, past their wait for a decision, into a
            # recreate of their own.
            new_gang = self.st.gang == self.st.restart_attempt
            before = len(churn.recent(self.st.attempt_times, self.now)) - 1
            delay = max(
                backoff_seconds(job.spec.restart_policy, self.st.restarts - 1),
                churn.floor_seconds(before) if new_gang else 0.0,
            )
            start = self.now + timedelta(seconds=delay)
            self.st.restart_at = format_time(start)
        if self.now < start:
            self.deadlines.append(start)  # step 3: the backoff
            return False
        self.st.phase = Phase.PENDING
        self.st.restart_at = None
        self.cond(
            C.RESTARTING, False, Reason.RESTARTED, f"attempt {self.st.restart_attempt} started"
        )
        return True

    def count_gang(self) -> None:
        """A restart recreates the gang: it counts toward the operator's floor (core/churn.py)."""
        attempts = churn.recent(self.st.attempt_times, self.now)
        self.st.attempt_times = churn.recent([*attempts, format_time(self.now)], self.now)

    def lost_pods(self, current: list[PodView]) -> list[Failure]:
        """The failures of the gang's pods that can run no rank any more: terminated, deleted,
        on a lost node, or (the launchers' report says) whose launcher dropped out."""
        report = self.report()
        gone = {x.pod: x for x in report.lost} if report is not None else {}
        lost = []
        for x in current:
            failure, look_again = classify(x, self.nodes, self.now)
            if look_again is not None:
                self.deadlines.append(look_again)
            if failure is None and x.name in gone and x.active:
                failure = launcher_lost(x, gone[x.name].time)
            if failure is not None:
                lost.append(failure)
        return lost

    def absorb(self, job: MegatronJob, lost: list[Failure], current: list[PodView]) -> None:
        """A pod lost while a restart waits for its release belongs to that restart (the kubelet
        often reports a dead container after its launcher's connection already dropped): it is
        replaced, or every pod is recreated if it hosts the rendezvous. Nothing more is
        counted; a pod's loss explains an in-place restart's rank errors better, so it becomes
        the restart's recorded cause."""
        record = self.st.last_failure if self.st.last_failure is not None else {}
        names = ", ".join(f.pod or "?" for f in lost[:5])
        doomed = {f.pod for f in lost}
        taken = set(self.st.swapped().values())
        free = [x for x in self.ready_spares() if x.name not in taken]
        if self.spare_nodes and record.get("rung") != Rung.RECREATE:
            swaps = spares.assign([f.node_rank for f in lost if f.node_rank is not None], free)
        else:
            swaps = {}
        if any(f.node_rank == MASTER_NODE_RANK and MASTER_NODE_RANK not in swaps for f in lost):
            if record.get("rung") != Rung.RECREATE:
                why = (
                    f"pod {names} was lost during the restart, and node rank 0 hosts the rendezvous"
                )
                record.update(rung=str(Rung.RECREATE), rungReason=why)
                self.count_gang()
                self.st.gang_attempt = None  # a new gang: every kept pod is stale
                self.st.failed_nodes = None
                self.st.swaps = None  # every rank on the pod created for it again
                self.st.coordinator = None  # node rank 0's launcher again
                self.event(EventType.WARNING, Reason.RESTARTING, f"recreating every pod ({why})")
            self.st.last_failure = record or None
            self.delete(current)
            return
        swapped = all(f.node_rank in swaps for f in lost)
        rung = Rung.SPARE_SWAP if swapped else Rung.REPLACE_POD
        if record.get("rung") == Rung.SPARE_SWAP and not swapped:
            record.update(rung=str(Rung.REPLACE_POD))
            self.event(
                EventType.WARNING,
                Reason.RESTARTING,
                f"pod {names} was lost during the restart and no spare is ready: replacing it",
            )
        if record.get("rung") == Rung.IN_PLACE:
            cause = first_failure(lost)
            assert cause is not None
            before = record.get("node")
            record.update(rung=str(rung), reason=cause.reason, message=cause.message)
            record.pop("exitCode", None)
            for key, value in (("pod", cause.pod), ("node", cause.node)):
                record.pop(key, None)
                if value:
                    record[key] = value
            if cause.exit_code is not None:
                record["exitCode"] = cause.exit_code
            nodes = self.st.failed_nodes or []
            if before and nodes and nodes[-1] == before:  # this restart's entry, now wrong
                self.st.failed_nodes = nodes[:-1] or None
            ladder.remember_node(cause, self.st)
            what = "its node rank moves onto a spare" if swapped else "replacing it"
            self.event(
                EventType.WARNING,
                Reason.RESTARTING,
                f"pod {names} was lost during the in-place restart: {what}",
            )
        self.st.last_failure = record or None
        self.move_ranks(job, swaps, lost)
        self.delete([x for x in current if x.name in doomed])

    def create_missing(
        self, job: MegatronJob, p: Plan, n: int, current: list[PodView], stale: list[PodView]
    ) -> None:
        if self.st.launched_attempt == n:
            return
        have = {x.node_rank for x in current}
        missing = [r for r in range(p.nodes) if r not in have]
        isolate = self.s.network_policy
        if not missing:
            self.st.launched_attempt = n
            if self.st.gang < n:
                # Released in place: refresh the ConfigMap, so a spec changed since (trainIters,
                # saveInterval) reaches the ranks once the kubelet syncs the mounted file.
                self.out.create = children(job, p, isolate=isolate, platform=self.platform)
            return
        if any(x.active for x in stale):
            # An older attempt's live pod holds the same hostname (MASTER_ADDR) until it stops.
            return
        if len(missing) == p.nodes:
            # A whole gang: its spares with it (the Workload's quota has them, and Kueue's
            # topology assignment places them in the gang's domain).
            gang = spares.Gang(current=current, spares=self.spares)
            missing += [p.nodes + i for i in spares.missing(gang, self.spare_nodes)]
        # Only the pods to create are rendered, each when its create call reads it: a huge job
        # never sits in memory whole.
        created: Pods | None = Pods(
            job, p, missing, n, platform=self.platform, coordinator=self.coordinator_address()
        )
        if self.queue is not None and created is not None:
            created = self.queue.admitted_pods(created)
        if created:
            self.out.create, self.out.pods = (
                children(job, p, isolate=isolate, platform=self.platform),
                created,
            )

    def blocked(self, conflict: str) -> None:
        """A child's name is taken by someone else's object: create nothing, and say so once."""
        self.out.create, self.out.pods = [], None
        self.deadlines.append(self.now + timedelta(seconds=CONFLICT_RETRY_SECONDS))
        if self.cond(C.CHILDREN_OWNED, False, Reason.CHILD_CONFLICT, conflict[:1000]):
            self.event(EventType.WARNING, Reason.CHILD_CONFLICT, conflict)

    def failures(self, job: MegatronJob, p: Plan, n: int, current: list[PodView]) -> list[Failure]:
        found: list[Failure] = []
        for x in current:
            failure, look_again = classify(x, self.nodes, self.now)
            if failure is not None:
                found.append(failure)
            if look_again is not None:
                self.deadlines.append(look_again)
        if self.st.launched_attempt == n:
            ranks = {x.node_rank for x in current}
            found += [
                Failure(
                    "PodDeleted",
                    pod=pod_name(job.name, r, n),
                    message="the pod disappeared",
                    node_rank=r,
                    pod_lost=True,
                )
                for r in range(p.nodes)
                if r not in ranks
            ]
        found += self.reported(n, p.procs_per_node, current, {f.pod for f in found})
        for extra in (self.hang(job, current), self.restart_timeout(job)):
            if extra is not None:
                found.append(extra)
        if self.st.phase != Phase.RUNNING and self.st.launched_attempt == n and not found:
            timeout = job.spec.restart_policy.startup_timeout_seconds
            late, look_again = startup_timeout(current, timeout, self.now)
            if look_again is not None:
                self.deadlines.append(look_again)
            if late is not None:
                found.append(late)
        return found

    def report(self) -> Report | None:
        """The launchers' report, unless it comes from a coordinator that lost its place to a
        newer one (a cut-off launcher of node rank 0 that is back)."""
        lease = self.w.lease
        report = lease.report if lease is not None else None
        return report if spares.trusted(report, self.st.coordinator) else None

    def reported(
        self, n: int, nproc: int, current: list[PodView], known: set[str | None]
    ) -> list[Failure]:
        """What the launchers reported: ranks of this attempt that exited on their own, and
        launchers that dropped out of pods that still look healthy. Only pods of this gang
        count: the report is the tenant's to write, so it can name nothing else."""
        report = self.report()
        if report is None:
            return []
        by_rank = {x.node_rank: x for x in current}
        by_name = {x.name: x for x in current}
        found: list[Failure] = []
        for gone in report.lost:
            x = by_name.get(gone.pod)
            if x is not None and x.name not in known and x.active:
                found.append(launcher_lost(x, gone.time))
        if report.attempt != n:
            return found  # an older attempt's failures: that restart is already decided
        for order, f in enumerate(report.failures):
            x = by_rank.get(f.node_rank)
            if x is None:
                continue
            rank = f.node_rank * nproc + f.local_rank
            message = f"rank {rank} (pod {x.name}) exited {f.exit_code} at {f.time}"
            exited = parse_time(f.time)
            found.append(
                Failure(
                    "Error",
                    f.exit_code,
                    x.name,
                    x.node,
                    message,
                    x.node_rank,
                    order=order,
                    rank=rank if f.local_rank < nproc else None,
                    finished=exited.timestamp() if exited is not None else None,
                )
            )
        return found

    def restart_timeout(self, job: MegatronJob) -> Failure | None:
        """An attempt restarted in place (or with a pod replaced) must report a training step
        within inPlaceTimeoutSeconds of its release; otherwise the gang is recreated."""
        if self.st.gang >= self.st.restart_attempt or self.stepped() or blind(job):
            return None
        released = since(self.st.conditions, C.RESTARTING, False, Reason.RESTARTED)
        if released is None:
            return None
        timeout = job.spec.restart_policy.in_place_timeout_seconds
        deadline = released + timedelta(seconds=timeout)
        if self.now < deadline:
            self.deadlines.append(deadline)
            return None
        message = (
            f"attempt {self.st.restart_attempt} reported no training step within "
            f"{timeout}s of its release (inPlaceTimeoutSeconds)"
        )
        return Failure("RestartTimeout", None, None, None, message)

    def stepped(self) -> bool:
        """The current attempt reported a training step (copied into status.progress)."""
        return (self.st.progress or {}).get("attempt") == self.st.restart_attempt

    def hang(self, job: MegatronJob, current: list[PodView]) -> Failure | None:
        policy = job.spec.restart_policy
        timeout = policy.hang_timeout_seconds
        since = parse_time(self.st.running_since)
        if timeout == 0 or self.st.phase != Phase.RUNNING or since is None or blind(job):
            return None
        first = not self.stepped()
        if self.st.gang < self.st.restart_attempt and first:
            # A lower rung's attempt is held to inPlaceTimeoutSeconds until its first step
            # (restart_timeout): its ranks import, rendezvous and restore first, which on a
            # loaded node took longer than a short hangTimeoutSeconds and restarted it again.
            return None
        # A new gang's first step comes after the imports, the rendezvous and the checkpoint's
        # load: a short hangTimeoutSeconds, right for a step, restarted healthy gangs there.
        limit = max(timeout, policy.first_step_timeout_seconds) if first else timeout
        rank0 = next((x for x in current if x.node_rank == 0), None)
        last = since
        beat = self.heartbeat()
        if beat is not None:
            last = max(last, beat)
        deadline = shift(last, limit, "status.runningSince")
        if self.now < deadline:
            self.deadlines.append(deadline)
            return None
        idle = int((self.now - last).total_seconds())
        if first:
            message = (
                f"no training step {idle}s after the pods ran (firstStepTimeoutSeconds "
                f"{policy.first_step_timeout_seconds}, hangTimeoutSeconds {timeout})"
            )
        else:
            message = (
                f"no progress for {idle}s (hangTimeoutSeconds {timeout}), last at "
                f"{format_time(last)}"
            )
        return Failure(
            "Hang",
            None,
            rank0.name if rank0 else pod_name(job.name, 0, self.st.restart_attempt),
            rank0.node if rank0 else None,
            message,
        )

    def fail_or_restart(
        self, job: MegatronJob, failures: list[Failure], current: list[PodView]
    ) -> None:
        cause = first_failure(failures)
        assert cause is not None
        recent = self.uncounted_last_hour()
        policy = job.spec.restart_policy
        decision = decide(cause, policy, self.st.restarts_counted, len(recent))
        record: dict[str, Any] = {
            "reason": cause.reason,
            "message": cause.message or decision.message,
            "action": decision.action
            if decision.action == "Fail"
            else ("Restart" if decision.counted else "RestartNotCounted"),
            "time": format_time(self.now),
        }
        if cause.pod:
            record["pod"] = cause.pod
        if cause.node:
            record["node"] = cause.node
        if cause.exit_code is not None:
            record["exitCode"] = cause.exit_code
        self.st.running_since = None
        self.event(
            EventType.WARNING,
            Reason.ATTEMPT_FAILED,
            attempt_report(self.st.restart_attempt, failures),
        )
        if decision.action == "Fail":
            self.keep(job, failures, current)
            self.st.last_failure = record
            reason = Reason.MAX_RESTARTS_EXCEEDED if decision.counted else Reason.FAILURE_POLICY
            self.finish(Phase.FAILED, reason, decision.message)
            self.delete(self.pods)
            return
        # The rules say restart; the ladder says how (the lowest rung that can).
        choice = ladder.choose(
            policy.strategy,
            failures,
            cause,
            self.st,
            self.stepped(),
            current,
            self.ready_spares() if self.spare_nodes else None,
            policy.recreate_on_repeated_node_failure,
        )
        record["rung"] = str(choice.rung)
        if choice.why:
            record["rungReason"] = choice.why
        self.st.last_failure = record
        self.st.restarts += 1
        if decision.counted:
            self.st.restarts_counted += 1
        else:
            recent.append(format_time(self.now))
        self.st.uncounted_restart_times = recent or None
        lost = [x for x in current if x.name in {f.pod for f in failures if f.pod_lost}]
        if choice.rung == Rung.RECREATE:
            self.count_gang()
            # Evidence: the failed pod stays (Failed, holding nothing). On the lower rungs the
            # healthy pods keep their logs, and a lost pod's replacement takes its place.
            self.keep(job, failures, current)
            self.st.next_gang()
            doomed = current  # step 1: every pod of the gang, with its grace period
        else:
            self.st.next_in_place()
            ladder.remember_node(cause, self.st)
            doomed = lost  # the pods that are gone anyway; the others keep running
            self.move_ranks(job, choice.swaps, [f for f in failures if f.pod_lost])
        self.st.phase = Phase.RESTARTING
        self.st.restart_at = None
        self.out.restart_reason = cause.reason
        self.out.restart_rung = choice.rung
        replaced = [x.name for x in lost if x.node_rank not in choice.swaps]
        what = ladder.describe(
            choice.rung, self.st.restart_attempt, replaced, choice.why, choice.swaps
        )
        message = f"{decision.message}: {what}"
        self.cond(C.RUNNING, False, Reason.RESTARTING, message)
        self.cond(C.RESTARTING, True, cause.reason, message)
        self.event(EventType.WARNING, Reason.RESTARTING, message)
        self.delete(doomed)
        in_place = choice.rung in (Rung.IN_PLACE, Rung.SPARE_SWAP)
        if not in_place and not (self.out.delete_pods or self.out.force_delete):
            # Nothing goes (a one-pod gang whose failed pod is kept, or every lost pod already
            # gone): no pod event will wake the job, so the backoff starts at the next pass, now.
            self.deadlines.append(self.now)
        if in_place:
            # Nothing to wait for before the backoff (no pod goes): it starts now, and the
            # release is due when it ends (no pod event would wake the job before that).
            # The job's backoff alone: no new gang, so not the operator's floor (core/churn.py).
            start = self.now + timedelta(seconds=backoff_seconds(policy, self.st.restarts - 1))
            self.st.restart_at = format_time(start)
            self.deadlines.append(start)

    def move_ranks(self, job: MegatronJob, swaps: dict[int, str], lost: list[Failure]) -> None:
        """Record where each lost node rank goes in the next attempt (status.swaps): onto the
        spare `swaps` names, or (ReplacePod) onto the pod made for it in this attempt, when its
        lost holder was a pod named in swaps already."""
        if not swaps and not self.st.swaps:
            return
        moved = self.st.swapped()
        for f in lost:
            r = f.node_rank
            if r is None:
                continue
            if r in swaps:
                moved[r] = swaps[r]
            elif r in moved:
                moved[r] = pod_name(job.name, r, self.st.restart_attempt)
        self.st.swaps = {str(r): moved[r] for r in sorted(moved)} or None

    def uncounted_last_hour(self) -> list[str]:
        """The uncounted restarts of the last hour (the restart-loop cap, core/policy.py)."""
        since = self.now - timedelta(seconds=UNCOUNTED_WINDOW_SECONDS)
        times = [parse_time(t) for t in self.st.uncounted_restart_times or []]
        return [format_time(t) for t in times if t is not None and since < t <= self.now]

    def scheduling(self, current: list[PodView]) -> None:
        """Say why pods wait: the scheduler's own message, on a PodsScheduled condition."""
        stuck = [x for x in current if x.unschedulable and x.phase == "Pending"]
        if stuck:
            msg = (
                f"{len(stuck)} pod(s) unschedulable, e.g. {stuck[0].name}: {stuck[0].unschedulable}"
            )
            self.cond(C.PODS_SCHEDULED, False, Reason.UNSCHEDULABLE, msg[:1000])
        elif current and all(x.node for x in current):
            self.cond(
                C.PODS_SCHEDULED, True, Reason.ALL_PODS_SCHEDULED, f"{len(current)} pods placed"
            )

    def starting(self, n: int, current: list[PodView], running: bool) -> None:
        """PodsStarted: False with the kubelet's or scheduler's reason while a pod cannot
        start (one event each time the reason changes), True once the gang runs."""
        problems = []
        for x in current:
            problem, look_again = startup_problem(x, self.now)
            if look_again is not None:
                self.deadlines.append(look_again)
            if problem is not None:
                problems.append(problem)
        before = reason_of(self.st.conditions, C.PODS_STARTED)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more pods)" if len(problems) > 1 else ""
            self.cond(C.PODS_STARTED, False, first.reason, (first.message + more)[:1000])
            if before != first.reason:
                self.event(EventType.WARNING, first.reason, first.message + more)
        elif running:
            self.cond(C.PODS_STARTED, True, Reason.ALL_PODS_STARTED, f"attempt {n} is running")
        elif before is not None and before != Reason.STARTING:
            self.cond(C.PODS_STARTED, False, Reason.STARTING, "the pods are starting")

    def advance(self, p: Plan, n: int, current: list[PodView]) -> None:
        self.scheduling(current)
        launched = self.st.launched_attempt == n and len(current) == p.nodes
        if launched and reason_of(self.st.conditions, C.CHILDREN_OWNED) == Reason.CHILD_CONFLICT:
            self.cond(C.CHILDREN_OWNED, True, Reason.CHILDREN_CREATED, "every child is the job's")
        if launched and all(x.succeeded for x in current):
            self.finish(Phase.SUCCEEDED, Reason.COMPLETED, f"all {p.nodes} pods exited 0")
            return
        running = launched and all(x.phase == "Running" or x.succeeded for x in current)
        self.starting(n, current, running)
        if running and self.st.phase != Phase.RUNNING:
            self.st.phase = Phase.RUNNING
            self.st.running_since = format_time(self.now)
            self.out.entered_running = True
            message = f"{p.nodes} pods running (attempt {n})"
            self.cond(C.RUNNING, True, Reason.ALL_PODS_RUNNING, message)
            if self.st.gang < n:
                text = f"attempt {n} runs in the gang's {p.nodes} pods (restarted in place)"
            else:
                text = f"all {p.nodes} pods are running (attempt {n})"
            self.event(EventType.NORMAL, Reason.RUNNING, text)
        elif not running and self.st.phase == Phase.RUNNING:
            self.st.phase = Phase.PENDING
            self.st.running_since = None
            self.cond(C.RUNNING, False, Reason.PODS_NOT_RUNNING, "not every pod is running")

    def lease(self) -> LeaseView | None:
        """The progress Lease, if its record belongs to the current attempt."""
        lease = self.w.lease
        return lease.for_attempt(self.st.restart_attempt) if lease is not None else None

    def heartbeat(self) -> datetime | None:
        """The Lease's renewTime. One beyond a small clock skew is no heartbeat: a year-9999
        stamp would overflow the hang deadline, or postpone it forever."""
        lease = self.lease()
        if lease is None or lease.renew_time is None:
            return None
        if lease.renew_time > self.now + timedelta(seconds=CLOCK_SKEW_SECONDS):
            return None
        return min(lease.renew_time, self.now)

    def copy_progress(self, job: MegatronJob, final: bool = False) -> None:
        """The Lease's newest record into status.progress, at most once per rate-limit window;
        `final`: the job just finished, and its last record is copied at once (no later pass
        would copy it: a finished job is not woken by its Lease)."""
        lease = self.lease()
        if lease is None or lease.progress is None:
            return
        prog = lease.progress
        old = self.st.progress or {}
        old_time = parse_time(old.get("time"))
        old_step = old.get("iteration")
        old_step = old_step if isinstance(old_step, int) and not isinstance(old_step, bool) else -1
        # A new attempt's first record is always copied: it says the restart reached its step.
        # Records carry whole seconds: several steps in one second differ by iteration only.
        if (
            old.get("attempt") == prog.attempt
            and old_time is not None
            and (old_time, old_step) >= (prog.time, prog.iteration)
        ):
            return
        hold = self.w.progress_not_before
        # A restart's first record is copied at once: the ladder reads it (stepped()). Only the
        # current attempt's, once: a Lease that alternates attempts gets no more copies.
        current = prog.attempt == self.st.restart_attempt
        first = current and prog.attempt > 0 and old.get("attempt") != prog.attempt
        if hold is not None and self.now < hold and not final and not first:
            self.deadlines.append(hold)  # copy the newest record then
            return
        self.st.progress = prog.to_status()
        if prog.restored is not None:
            tiers.remember(self.st, prog.attempt, *prog.restored)
        train = job.spec.training
        self.st.progress_summary = summary(prog, train.train_iters if train else None)

    def done(self) -> Outcome:
        if self.queue is not None:
            self.out.workload = self.queue.settle(self.w.pods, self.current) or None
        # The goodput ledger: this reconcile's facts, on the status write it makes anyway.
        old = self.w.job.get("status")
        accounting.settle(old, self.st, self.now, self.w.job, self.w.lease, self.current)
        self.out.status = self.st.to_raw()
        soonest = min(self.deadlines, default=None)
        wait = math.inf
        if soonest is not None:
            wait = max((soonest - self.now).total_seconds(), 0.0) + 0.05
            self.out.requeue_after = min(self.out.requeue_after, wait)
        busy = self.out.delete_pods or self.out.create or self.out.pods or self.out.force_delete
        if self.quiet and not busy:
            self.out.requeue_after = wait if soonest is not None else math.inf
        if busy:
            self.out.requeue_after = min(self.out.requeue_after, 5.0)
        return self.out


def blind(job: MegatronJob) -> bool:
    """A trainer.command with no progress source (trainer.progress None): no step ever comes,
    so neither the hang rule nor the in-place restart's wait for a step can judge it."""
    return job.spec.trainer is not None and job.spec.trainer.progress == "None"


def launcher_lost(x: PodView, when: str) -> Failure:
    message = (
        f"the launcher of pod {x.name} lost its connection to the rendezvous host at {when} "
        "(its container died, or its network failed)"
    )
    return Failure("LauncherLost", None, x.name, x.node, message, x.node_rank, pod_lost=True)


def summary(progress: Progress, train_iters: int | None) -> str:
    """e.g. '1200/10000 loss 2.31'; without spec.training (a trainer.command) 'step 1200 …'."""
    text = f"{progress.iteration}/{train_iters}" if train_iters else f"step {progress.iteration}"
    if progress.loss is not None:
        text += f" loss {progress.loss:.4g}"
    return text


def reconcile(world: World, settings: Settings | None = None) -> Outcome:
    """Decide the next status and actions for one job. The job's own data that cannot be
    processed (BadJobData: a hand-written status.runningSince in year 9999, say) fails this job
    with a condition naming the error, rather than a traceback every few seconds.

    Any other exception is a bug of ours and propagates: the shell retries it with a backoff and
    a metric, and never fails the job or deletes its pods over it (a GPU job must not pay for
    an operator bug)."""
    settings = settings or Settings()
    try:
        return _Machine(world, settings).run()
    except BadJobData as exc:
        return _unprocessable(world, settings, exc)


def _unprocessable(world: World, settings: Settings, exc: BadJobData) -> Outcome:
    """The job fails (its pods are deleted: nothing may hold a GPU unwatched); the status
    keeps everything else, so a person can see what was wrong."""
    m = _Machine(replace(world, job={**world.job, "status": {}}), settings)
    m.st = JobStatus.read(world.job.get("status"))
    m.deadlines = []
    message = (
        f"the operator cannot process this job's data ({exc}); check the status times and "
        "the durations in the spec, then delete and re-create the job"
    )[:1000]
    if reason_of(m.st.conditions, C.FAILED) != Reason.BAD_JOB_DATA:
        m.finish(Phase.FAILED, Reason.BAD_JOB_DATA, message)
    m.delete(m.pods)
    m.out.status = m.st.to_raw()
    m.out.requeue_after = settings.resync_seconds
    return m.out
