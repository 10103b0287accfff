"""What one reconcile saw, as the goodput ledger's facts, and when the ledger is written (pure).

The state machine changes a copy of the job's status; this compares it with the status it read
and turns the differences into ledger events (core/ledger.py), with the World's own facts (the
pods' placement, the Lease's newest record and the launchers' report), then folds them into the
ledger read from the status. Every event's time is the reconcile's `now` or a time a first-hand
source wrote (the scheduler's binding, a launcher's exit report, the trainer's clock).

Writes: the ledger rides on the status write a reconcile makes anyway (a phase change, a
progress copy); on its own it is written at most once per WRITE_SECONDS. A reconcile that would
change nothing else keeps the ledger the status holds, which is then exact up to its `asOf`:
the fold is cumulative (the next reconcile folds from there with the facts it sees then, and the
trainer's timeline fields are cumulative too), so nothing is lost by not writing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from megatron_operator.api.status import Phase, Rung
from megatron_operator.core import forecast
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.ledger import (
    Escalated,
    Event,
    Failed,
    Finished,
    Launched,
    Ledger,
    Mode,
    Placed,
    Queued,
    Record,
    Suspended,
    Tick,
    fold,
)
from megatron_operator.core.observe import LeaseView, PodView, parse_time

WRITE_SECONDS = 30.0  # the ledger's own status writes: at most one per this many seconds
_DERIVED = ("ledger", "forecast")
_ENDED = (Phase.SUCCEEDED, Phase.FAILED)
_RUNS = (Phase.PENDING, Phase.RUNNING)


def settle(
    old: object,
    st: JobStatus,
    now: datetime,
    job: Mapping[str, Any],
    lease: LeaseView | None,
    current: Sequence[PodView],
) -> None:
    """Fold this reconcile's facts into `st.ledger` and `st.forecast`, if the status is written
    anyway or the ledger's last write is WRITE_SECONDS old; else leave the ones `st` read."""
    before: Mapping[str, Any] = old if isinstance(old, Mapping) else {}
    prior = Ledger.read(before.get("ledger"))
    ledger = prior if prior is not None else begin(before, st, now, job)
    if ledger is None:
        return
    ledger = fold(ledger, facts(before, st, now, lease, current))
    changed = _without(st.to_raw()) != _without(before)
    if prior is not None and not changed and now - prior.as_of < timedelta(seconds=WRITE_SECONDS):
        return  # nothing else is written: the ledger waits (what it saw is seen again)
    st.ledger = ledger.to_status()
    st.forecast = forecast.for_job(ledger, st, job.get("spec"), now)


def _without(status: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k not in _DERIVED}


def begin(
    old: Mapping[str, Any], st: JobStatus, now: datetime, job: Mapping[str, Any]
) -> Ledger | None:
    """A new ledger: from the job's creation for a new job. A job that has run without one (an
    older operator ran it, or its ledger was unusable) starts one now, its past unattributed; a
    job that has already ended gets none."""
    meta = job.get("metadata")
    created = parse_time(meta.get("creationTimestamp")) if isinstance(meta, Mapping) else None
    origin = min(created or now, now)
    phase = _phase(old.get("phase"))
    if phase is None:
        return Ledger.start(origin)
    if phase in _ENDED:
        return None
    ledger = Ledger.start(origin, Mode.DONE)
    ledger.apply(Launched(now, st.restart_attempt))  # the past: unattributed
    mode = {
        Phase.QUEUED: Mode.QUEUED,
        Phase.SUSPENDED: Mode.SUSPENDED,
        Phase.RESTARTING: Mode.RESTARTING,
        Phase.RUNNING: Mode.TRAINING,
    }.get(phase, Mode.SCHEDULING)
    ledger.mode = mode
    step = (st.progress or {}).get("iteration")
    if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
        ledger.last_iteration = ledger.high = step
    rung = (st.last_failure or {}).get("rung")
    ledger.rung = Rung(rung) if rung in tuple(Rung) else None
    return ledger


def facts(
    old: Mapping[str, Any],
    st: JobStatus,
    now: datetime,
    lease: LeaseView | None,
    current: Sequence[PodView],
) -> list[Event]:
    """This reconcile's events, in the order they happened: time up to now, the newest record
    and the pods' placement (of the attempt the ledger follows), then the operator's decisions,
    then placement and record again (of an attempt the decisions just launched)."""
    was, phase = _phase(old.get("phase")), st.phase
    attempt = _count(old.get("restartAttempt"))
    record = _record(lease)
    placed = _placed(st, current, now)
    events: list[Event] = [Tick(now)]
    events += [e for e in (record, placed) if e is not None]
    if st.restarts > _count(old.get("restarts")):
        failed_at, hang, exact = failure_time(st, old, now, lease, current, attempt)
        rung = (st.last_failure or {}).get("rung")
        events.append(
            Failed(
                now, failed_at, Rung(rung) if rung in tuple(Rung) else Rung.RECREATE, hang, exact
            )
        )
    elif phase == Phase.RESTARTING and was == Phase.RESTARTING:
        rung = (st.last_failure or {}).get("rung")
        before = old.get("lastFailure")
        if rung in tuple(Rung) and rung != (
            before.get("rung") if isinstance(before, dict) else None
        ):
            events.append(Escalated(now, Rung(rung)))
    if phase in _ENDED and was not in _ENDED:
        ended = (
            failure_time(st, old, now, lease, current, attempt) if phase == Phase.FAILED else None
        )
        if ended is None:
            events.append(Finished(now))
        else:
            events.append(Finished(now, ended[0], ended[2]))
    elif phase == Phase.QUEUED and was != Phase.QUEUED:
        events.append(Queued(now))
    elif phase == Phase.SUSPENDED and was != Phase.SUSPENDED:
        events.append(Suspended(now))
    elif phase in _RUNS and (was not in _RUNS or st.restart_attempt != attempt):
        events.append(Launched(now, st.restart_attempt))
    events += [e for e in (placed, record) if e is not None]
    return events


def _phase(value: object) -> Phase | None:
    """The phase a status read holds (anything else: none, as JobStatus reads it)."""
    return Phase(value) if isinstance(value, str) and value in tuple(Phase) else None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _epoch(value: float | None) -> datetime | None:
    return datetime.fromtimestamp(value, UTC) if value is not None else None


def _record(lease: LeaseView | None) -> Record | None:
    """The Lease's newest record (of whichever attempt: the ledger keeps its own attempt's)."""
    prog = lease.progress if lease is not None else None
    if prog is None:
        return None
    c = prog.clock
    if c is None:
        return Record(prog.time, prog.attempt, prog.iteration)
    return Record(
        at=_epoch(c.now) or prog.time,
        attempt=prog.attempt,
        iteration=prog.iteration,
        began=_epoch(c.began),
        loop=_epoch(c.loop),
        start=c.start,
        rendezvous=c.rendezvous,
        load=c.load,
        save=c.save,
    )


def _placed(st: JobStatus, current: Sequence[PodView], now: datetime) -> Placed | None:
    """Every pod of the current attempt exists and is bound to a node (or already runs: local
    process groups have no scheduler): at the latest binding."""
    if st.launched_attempt != st.restart_attempt or not current:
        return None
    if any(x.scheduled_at is None and x.phase == "Pending" for x in current):
        return None
    times = [x.scheduled_at for x in current if x.scheduled_at is not None]
    return Placed(min(max(times), now) if times else now, st.restart_attempt)


def failure_time(
    st: JobStatus,
    old: Mapping[str, Any],
    now: datetime,
    lease: LeaseView | None,
    current: Sequence[PodView],
    attempt: int,
) -> tuple[datetime, bool, bool]:
    """When the failure behind this decision happened, whether it is a hang (then: the last
    sign of life, the Lease's heartbeat or the attempt's start), and whether a first-hand
    source timed it: the launchers' report of a rank's exit or of the failed pod's launcher
    dropping out, the kubelet's end of the failed pod's trainer. Otherwise (a node found lost,
    a pod gone) it is the decision itself, later than the failure."""
    record = st.last_failure or {}
    if record.get("reason") == "Hang":
        beat = lease.renew_time if lease is not None and lease.progress is not None else None
        if beat is not None and lease is not None and lease.progress is not None:
            beat = beat if lease.progress.attempt == attempt else None
        since = beat or parse_time(old.get("runningSince"))
        return (min(since, now) if since is not None else now), True, since is not None
    times: list[datetime] = []
    report = lease.report if lease is not None else None
    if report is not None and report.attempt == attempt:
        times += [t for t in (parse_time(f.time) for f in report.failures) if t is not None]
    if report is not None:  # the failed pod's launcher dropped out of the rendezvous then
        gone = (parse_time(x.time) for x in report.lost if x.pod == record.get("pod"))
        times += [t for t in gone if t is not None]
    pod = next((x for x in current if x.name == record.get("pod")), None)
    if pod is not None and pod.finished_at is not None:
        times.append(pod.finished_at)
    if not times:
        return now, False, False
    return min(*times, now), False, True
