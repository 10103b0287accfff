"""The job's state machine (pure): what the operator sees → the next status and what to do.

Level-triggered: every call starts from a fresh observation (the job, its pods, node readiness),
so an operator killed at any point converges when it starts again. The shell applies an Outcome
in a fixed order, which is what makes that true:

1. write the status (one write per reconcile);
2. emit the events (only after the write succeeded);
3. delete pods, then create pods.

A restart is therefore recorded (attempt N+1, restarts+1) *before* any pod of attempt N is
deleted, and pods are created only for an attempt the status already names: a crash between
steps repeats no restart and leaves no pod behind.

Pods keep their names across attempts (`<job>-<rank>`); the attempt is a label. Lifecycle of an
attempt: Pending (creating, scheduling) → Running (every pod Running) → Succeeded (every pod
exited 0) | a failure → Restarting (old pods deleted, then a capped exponential backoff) → the
next attempt, or Failed when the failure rules or maxRestarts say so.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .api import FieldError, MegatronJob, MegatronJobSpec, SpecError, load_job
from .api.spec import FailureReason
from .api.status import PHASES
from .api.transitions import check_update
from .conditions import reason_of, set_condition
from .layout import Plan, plan
from .names import pod_name
from .observe import PodView, Progress, format_time, parse_progress, parse_time
from .policy import Failure, backoff_seconds, decide, first_failure

# Types of the conditions the operator maintains.
RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED, SCHEDULED = (
    "Running",
    "Restarting",
    "Suspended",
    "Succeeded",
    "Failed",
    "PodsScheduled",
)


@dataclass(frozen=True)
class Settings:
    node_lost_grace_seconds: float = 30.0  # NotReady this long = the node is lost
    resync_seconds: float = 60.0  # reconcile at least this often


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


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    create_ranks: list[int] = field(default_factory=list)
    attempt: int = 0
    job: MegatronJob | None = None  # the validated job, when pods are to be created
    plan: Plan | None = None
    delete_job: bool = False
    requeue_after: float = 60.0
    restart_reason: str | None = None  # for the restarts_total metric
    entered_running: bool = False


def _strip(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: doc[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in doc}


def _clean_int(value: object, default: int = 0) -> int:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def _validate(
    world: World, phase: str | None
) -> tuple[MegatronJob | None, Plan | None, list[FieldError]]:
    try:
        job = load_job(_strip(world.job))
        p = plan(job.spec)
    except SpecError as exc:
        return None, None, exc.errors
    if world.accepted_spec is not None:
        try:
            old = MegatronJobSpec.model_validate(dict(world.accepted_spec))
        except ValueError:
            old = None  # an unreadable record is not the user's fault: accept the new spec
        if old is not None:
            errors = check_update(old, job.spec, suspended=phase == "Suspended")
            if errors:
                return None, None, errors
    return job, p, []


class _Machine:
    """One reconcile: reads `world`, mutates a copy of the status, collects actions."""

    def __init__(self, world: World, settings: Settings) -> None:
        self.w = world
        self.s = settings
        self.now = world.now
        meta = world.job.get("metadata") or {}
        self.uid: str | None = meta.get("uid")
        self.generation: int | None = meta.get("generation")
        raw = world.job.get("status")
        st = copy.deepcopy(dict(raw)) if isinstance(raw, Mapping) else {}
        conds = st.get("conditions")
        st["conditions"] = (
            [c for c in conds if isinstance(c, dict)] if isinstance(conds, list) else []
        )
        for key in ("restartAttempt", "restarts", "restartsCounted"):
            st[key] = _clean_int(st.get(key))
        if st.get("phase") not in PHASES:
            st.pop("phase", None)  # someone else's write, or garbage: start from what we see
        if "launchedAttempt" in st and _clean_int(st["launchedAttempt"], -1) < 0:
            del st["launchedAttempt"]
        for key in ("lastFailure", "progress"):
            if key in st and not isinstance(st[key], dict):
                del st[key]
        self.st = st
        self.out = Outcome(status=st, requeue_after=settings.resync_seconds)
        self.deadlines: list[datetime] = []

    # --- helpers
    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> bool:
        return set_condition(
            self.st["conditions"], type_, status, reason, message, self.now, self.generation
        )

    def event(self, type_: str, reason: str, message: str) -> None:
        self.out.events.append(Event(type_, reason, message))

    def delete(self, pods: list[PodView]) -> None:
        self.out.delete_pods.extend(p.name for p in pods if not p.deleting)

    def mine(self, p: PodView) -> bool:
        return p.job_uid is None or self.uid is None or p.job_uid == self.uid

    def finish(self, phase: str, reason: str, message: str) -> None:
        self.st["phase"] = phase
        self.st["completionTime"] = format_time(self.now)
        self.st.pop("restartAt", None)
        self.cond(RUNNING, False, reason, message)
        self.cond(RESTARTING, False, reason, message)
        self.cond(phase, True, reason, message)
        self.event("Normal" if phase == SUCCEEDED else "Warning", reason, message)

    # --- the steps
    def run(self) -> Outcome:
        phase = self.st.get("phase")
        job, p, errors = _validate(self.w, phase)
        if self.w.rejection is not None:
            errors = [
                FieldError(
                    "spec", f"the apiserver rejected the pods rendered from it: {self.w.rejection}"
                )
            ]
        if job is None or p is None or errors:
            self.invalid(errors)
            return self.done()
        self.st["observedGeneration"] = self.generation
        self.st["layout"] = p.layout_string()
        self.st["gpus"] = p.gpus
        self.st["worldSize"] = p.world_size
        self.out.job, self.out.plan = job, p
        if phase == FAILED and reason_of(self.st["conditions"], FAILED) == "InvalidSpec":
            self.revive()  # the spec was fixed
            phase = self.st["phase"]
        if phase in (SUCCEEDED, FAILED):
            self.terminal(job, phase)
            return self.done()
        if job.spec.suspend:
            self.suspend()
            return self.done()
        if phase == SUSPENDED:
            self.resume()
        self.active(job, p)
        if self.st.get("phase") in (SUCCEEDED, FAILED):
            self.ttl(job)  # it just finished: schedule the TTL now, not at the next resync
        return self.done()

    def invalid(self, errors: list[FieldError]) -> None:
        message = "; ".join(str(e) for e in errors)[:4000]
        already = (
            self.st.get("phase") == FAILED
            and reason_of(self.st["conditions"], FAILED) == "InvalidSpec"
            and self.st.get("observedGeneration") == self.generation
        )
        self.st["observedGeneration"] = self.generation
        if not already:
            self.finish(FAILED, "InvalidSpec", message)
        self.delete(self.w.pods)

    def revive(self) -> None:
        self.st["phase"] = "Pending"
        self.st["restartAttempt"] += 1
        self.st.pop("completionTime", None)
        self.cond(FAILED, False, "SpecFixed", "the spec is valid again")
        self.event("Normal", "SpecFixed", "the spec is valid again: starting")

    def terminal(self, job: MegatronJob, phase: str) -> None:
        # Nothing may hold a GPU after the end; failed jobs also drop their finished pods.
        doomed = self.w.pods if phase == FAILED else [p for p in self.w.pods if p.active]
        self.delete(doomed)
        self.ttl(job)

    def ttl(self, job: MegatronJob) -> None:
        ttl = job.spec.ttl_seconds_after_finished
        done_at = parse_time(self.st.get("completionTime"))
        if ttl is not None and done_at is not None:
            expiry = done_at + timedelta(seconds=ttl)
            if self.now >= expiry:
                self.out.delete_job = True
            else:
                self.deadlines.append(expiry)

    def suspend(self) -> None:
        self.delete(self.w.pods)
        left = len(self.w.pods)
        message = f"waiting for {left} pods to stop" if left else "all pods stopped"
        if self.st.get("phase") != SUSPENDED:
            self.st["phase"] = SUSPENDED
            self.st.pop("restartAt", None)
            self.st.pop("runningSince", None)
            self.cond(RUNNING, False, "Suspended", "spec.suspend is true")
            self.cond(RESTARTING, False, "Suspended", "spec.suspend is true")
            self.event("Normal", "Suspended", "spec.suspend is true: stopping the pods")
        self.cond(SUSPENDED, True, "Suspended", message)

    def resume(self) -> None:
        # A fresh attempt (not a restart): pods of the suspended attempt may still be stopping.
        self.st["restartAttempt"] += 1
        self.st["phase"] = "Pending"
        self.cond(SUSPENDED, False, "Resumed", "spec.suspend is false")
        self.event("Normal", "Resumed", "spec.suspend is false: starting a new attempt")

    def active(self, job: MegatronJob, p: Plan) -> None:
        n = self.st["restartAttempt"]
        self.out.attempt = n
        if self.st.get("phase") is None:
            self.st["phase"] = "Pending"
            self.event("Normal", "Created", f"planned {p.layout_string()}: {p.nodes} pods")
        # Set before any child exists: the delete handler skips jobs that never started.
        self.st.setdefault("startTime", format_time(self.now))
        current: list[PodView] = []
        stale: list[PodView] = []
        for x in self.w.pods:
            (current if x.attempt == n and self.mine(x) else stale).append(x)
        self.delete(stale)
        self.copy_progress(job, current)

        if self.st["phase"] == RESTARTING and not self.restart_wait_over(job, stale):
            return
        self.create_missing(job, p, n, current, stale)
        failures = self.failures(job, p, n, current)
        if failures:
            self.fail_or_restart(job, failures, current)
            return
        self.advance(p, n, current)

    def restart_wait_over(self, job: MegatronJob, stale: list[PodView]) -> bool:
        if stale:
            return False  # step 2: wait until every pod of the failed attempt is gone
        start = parse_time(self.st.get("restartAt"))
        if start is None:
            delay = backoff_seconds(job.spec.restart_policy, self.st["restarts"] - 1)
            start = self.now + timedelta(seconds=delay)
            self.st["restartAt"] = format_time(start)
        if self.now < start:
            self.deadlines.append(start)  # step 3: the backoff
            return False
        self.st["phase"] = "Pending"
        self.st.pop("restartAt", None)
        self.cond(RESTARTING, False, "Restarted", f"attempt {self.st['restartAttempt']} started")
        return True

    def create_missing(
        self, job: MegatronJob, p: Plan, n: int, current: list[PodView], stale: list[PodView]
    ) -> None:
        if self.st.get("launchedAttempt") == n:
            return
        have = {x.name for x in current}
        occupied = {x.name for x in stale}  # same name, older attempt, still going away
        missing = [r for r in range(p.nodes) if pod_name(job.name, r) not in have]
        if not missing:
            self.st["launchedAttempt"] = n
            return
        self.out.create_ranks = [r for r in missing if pod_name(job.name, r) not in occupied]

    def failures(self, job: MegatronJob, p: Plan, n: int, current: list[PodView]) -> list[Failure]:
        found = [f for f in (self.classify(x) for x in current) if f is not None]
        if self.st.get("launchedAttempt") == n:
            names = {x.name for x in current}
            found += [
                Failure("PodDeleted", pod=pod_name(job.name, r), message="the pod disappeared")
                for r in range(p.nodes)
                if pod_name(job.name, r) not in names
            ]
        hang = self.hang(job, current)
        if hang is not None:
            found.append(hang)
        return found

    def classify(self, x: PodView) -> Failure | None:
        if x.phase == "Succeeded":
            return None
        if x.phase == "Failed":
            return Failure(self.failed_reason(x), x.exit_code, x.name, x.node, self.detail(x))
        if x.deleting:
            reason: FailureReason = self.failed_reason(x) if x.disruption else "PodDeleted"
            return Failure(reason, None, x.name, x.node, "deleted while the job was running")
        if x.phase == "Unknown":
            return Failure("NodeLost", None, x.name, x.node, "the pod's state is Unknown")
        if x.node is not None:
            if self.w.known_nodes is not None and x.node not in self.w.known_nodes:
                return Failure("NodeLost", None, x.name, x.node, f"node {x.node} is gone")
            since = self.w.not_ready_nodes.get(x.node)
            if since is not None:
                lost_at = since + timedelta(seconds=self.s.node_lost_grace_seconds)
                if self.now >= lost_at:
                    return Failure(
                        "NodeLost",
                        None,
                        x.name,
                        x.node,
                        f"node {x.node} NotReady since {format_time(since)}",
                    )
                self.deadlines.append(lost_at)
        return None

    @staticmethod
    def failed_reason(x: PodView) -> FailureReason:
        if x.disruption == "PreemptionByScheduler":
            return "Preempted"
        if x.disruption == "DeletionByTaintManager":
            return "NodeLost"
        if x.disruption:
            return "DisruptionTarget"
        if x.status_reason == "Evicted":
            return "Evicted"
        if x.terminated_reason == "OOMKilled":
            return "OOMKilled"
        return "Error"

    @staticmethod
    def detail(x: PodView) -> str:
        parts = [f"pod {x.name}"]
        if x.node:
            parts.append(f"on {x.node}")
        if x.exit_code is not None:
            parts.append(f"exited {x.exit_code}")
        if x.terminated_reason:
            parts.append(f"({x.terminated_reason})")
        if x.disruption:
            parts.append(f"DisruptionTarget: {x.disruption}")
        if x.status_reason:
            parts.append(f"status reason {x.status_reason}")
        return " ".join(parts)

    def hang(self, job: MegatronJob, current: list[PodView]) -> Failure | None:
        timeout = job.spec.restart_policy.hang_timeout_seconds
        since = parse_time(self.st.get("runningSince"))
        if timeout == 0 or self.st.get("phase") != RUNNING or since is None:
            return None
        rank0 = next((x for x in current if x.node_rank == 0), None)
        last = since
        if rank0 is not None and rank0.progress is not None:
            last = max(last, rank0.progress.time)
        deadline = last + timedelta(seconds=timeout)
        if self.now < deadline:
            self.deadlines.append(deadline)
            return None
        idle = int((self.now - last).total_seconds())
        return Failure(
            "Hang",
            None,
            rank0.name if rank0 else pod_name(job.name, 0),
            rank0.node if rank0 else None,
            f"no progress for {idle}s (hangTimeoutSeconds {timeout}), last at {format_time(last)}",
        )

    def fail_or_restart(
        self, job: MegatronJob, failures: list[Failure], current: list[PodView]
    ) -> None:
        cause = first_failure(failures)
        assert cause is not None
        decision = decide(cause, job.spec.restart_policy, self.st["restartsCounted"])
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
        self.st["lastFailure"] = record
        self.st.pop("runningSince", None)
        if decision.action == "Fail":
            reason = "MaxRestartsExceeded" if decision.counted else "FailurePolicy"
            self.finish(FAILED, reason, decision.message)
            self.delete(self.w.pods)
            return
        self.st["restarts"] += 1
        if decision.counted:
            self.st["restartsCounted"] += 1
        self.st["restartAttempt"] += 1
        self.st["phase"] = RESTARTING
        self.st.pop("restartAt", None)
        self.out.restart_reason = cause.reason
        self.cond(RUNNING, False, "Restarting", decision.message)
        self.cond(RESTARTING, True, cause.reason, decision.message)
        self.event("Warning", "Restarting", decision.message)
        self.delete(current)  # step 1: every pod of the attempt, with its grace period

    def scheduling(self, current: list[PodView]) -> None:
        """Say why pods wait: the scheduler's own message, on a PodsScheduled condition."""
        stuck = [x for x in current if x.unschedulable and x.phase == "Pending"]
        if stuck:
            msg = (
                f"{len(stuck)} pod(s) unschedulable, e.g. {stuck[0].name}: {stuck[0].unschedulable}"
            )
            self.cond(SCHEDULED, False, "Unschedulable", msg[:1000])
        elif current and all(x.node for x in current):
            self.cond(SCHEDULED, True, "AllPodsScheduled", f"{len(current)} pods placed")

    def advance(self, p: Plan, n: int, current: list[PodView]) -> None:
        self.scheduling(current)
        launched = self.st.get("launchedAttempt") == n and len(current) == p.nodes
        if launched and all(x.phase == "Succeeded" for x in current):
            self.finish(SUCCEEDED, "Completed", f"all {p.nodes} pods exited 0")
            return
        running = launched and all(x.phase in ("Running", "Succeeded") for x in current)
        if running and self.st.get("phase") != RUNNING:
            self.st["phase"] = RUNNING
            self.st["runningSince"] = format_time(self.now)
            self.out.entered_running = True
            self.cond(RUNNING, True, "AllPodsRunning", f"{p.nodes} pods running (attempt {n})")
            self.event("Normal", "Running", f"all {p.nodes} pods are running (attempt {n})")
        elif not running and self.st.get("phase") == RUNNING:
            self.st["phase"] = "Pending"
            self.st.pop("runningSince", None)
            self.cond(RUNNING, False, "PodsNotRunning", "not every pod is running")

    def copy_progress(self, job: MegatronJob, current: list[PodView]) -> None:
        rank0 = next((x for x in current if x.node_rank == 0 and x.progress is not None), None)
        if rank0 is None or rank0.progress is None:
            return
        prog = rank0.progress
        old = self.st.get("progress")
        old_time = parse_time(old.get("time")) if isinstance(old, dict) else None
        if old_time is not None and old_time >= prog.time:
            return
        self.st["progress"] = prog.to_status()
        self.st["progressSummary"] = summary(prog, job.spec.training.train_iters)

    def done(self) -> Outcome:
        soonest = min(self.deadlines, default=None)
        if soonest is not None:
            wait = max((soonest - self.now).total_seconds(), 0.0) + 0.05
            self.out.requeue_after = min(self.out.requeue_after, wait)
        if self.out.delete_pods or self.out.create_ranks:
            self.out.requeue_after = min(self.out.requeue_after, 5.0)
        return self.out


def summary(progress: Progress, train_iters: int) -> str:
    text = f"{progress.iteration}/{train_iters}"
    if progress.loss is not None:
        text += f" loss {progress.loss:.4g}"
    return text


def reconcile(world: World, settings: Settings | None = None) -> Outcome:
    """Decide the next status and actions for one job. Never raises on bad input."""
    return _Machine(world, settings or Settings()).run()


__all__ = [
    "Event",
    "Outcome",
    "Settings",
    "World",
    "parse_progress",
    "reconcile",
]
