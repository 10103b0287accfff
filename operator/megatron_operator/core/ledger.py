"""The goodput ledger (pure): a fold over the job's first-hand facts, returning its wall time
split by cause (api.status.Cause; docs/metrics.md defines each).

The facts are events with the times the shell hands in: the operator's own decisions (an
attempt launched or released, a restart and its rung, a suspend, the end), the pods' placement,
and the trainer's records (a step reached, with the process's timeline: when it began, its
rendezvous, its checkpoint load, its blocking saves; contract §4 `clock`). Nothing here reads a
clock, the apiserver or free text.

How a second is attributed. The ledger keeps a cursor, `closed`: every second before it belongs
to exactly one cause, and none is ever moved. What lies between the cursor and the latest time
seen (`end`) is open: while the operator waits on the pods or the trainer, a later fact says
where it went (the first record of an attempt splits its start-up into start-up, rendezvous and
load; the next record says the time trained; a restart says the time since the last record was
lost in flight, then downtime). Until then the open interval shows as `unattributed`. So:

- the causes always sum to the wall time exactly (integer milliseconds);
- no cause but `unattributed` ever decreases, and none is negative;
- a fact older than the cursor (a late or skewed one) is clamped to it, never un-counted.

Steps are `productive` the first time the job reaches them and `recomputed` when an attempt
trains them again after a restart; the partial work a failure interrupts (from the last record to
the failure) is `recomputed` too. So a job's goodput is the fraction of its wall time that
produced new steps.

The ledger round-trips through the status (`to_status`, `read`) exactly, so an operator that
restarts continues the fold where the last one wrote it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from megatron_operator.api.status import RESTART_CAUSES, Cause, Rung
from megatron_operator.core.observe import parse_time

_MAX_MS = 10**15  # about 30,000 years: a bound on every offset read back from a status


class Mode(StrEnum):
    """What the job is doing, as far as the ledger knows."""

    QUEUED = "Queued"
    SCHEDULING = "Scheduling"  # the attempt's pods wait for nodes
    STARTING = "Starting"  # placed; the attempt has not reported its first step
    TRAINING = "Training"  # steps reported; the time since the last record is open
    RESTARTING = "Restarting"  # from a failure to the release of the next attempt
    SUSPENDED = "Suspended"
    DONE = "Done"


# Modes whose time is known as it passes: only the operator's own decision (at its now) ends
# them. Scheduling is not one: the pods' bindings, which end it, are seen after they happen.
_CERTAIN = {
    Mode.QUEUED: Cause.QUEUED,
    Mode.SUSPENDED: Cause.SUSPENDED,
}


# --- the events --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed up to `at` (the shell's now)."""

    at: datetime


@dataclass(frozen=True)
class Queued:
    """Waiting for Kueue's admission (or evicted back into the queue)."""

    at: datetime


@dataclass(frozen=True)
class Launched:
    """Attempt `attempt` began: its pods are created, or its ranks released in place."""

    at: datetime
    attempt: int


@dataclass(frozen=True)
class Placed:
    """Every pod of attempt `attempt` is on a node (the latest binding was at `at`)."""

    at: datetime
    attempt: int


@dataclass(frozen=True)
class Record:
    """A trainer record of `attempt`: step `iteration` reached at `at`, and the process's
    timeline when it reports one (None: not reported by the code)."""

    at: datetime
    attempt: int
    iteration: int
    began: datetime | None = None  # the process began (or its standby was released)
    loop: datetime | None = None  # its training loop began, after step `start`
    start: int | None = None
    rendezvous: float | None = None  # seconds
    load: float | None = None  # seconds
    save: float | None = None  # blocking save seconds so far in this process


@dataclass(frozen=True)
class Failed:
    """A restart decided at `at`, on rung `rung`, for a failure at `failed_at` (a rank's exit,
    a pod's end, or for a hang the last sign of life). `exact`: a first-hand source said when
    it failed; otherwise `failed_at` is when the failure was noticed (a node found lost), and
    the job cannot have trained unseen for longer than a record interval before it."""

    at: datetime
    failed_at: datetime
    rung: Rung
    hang: bool = False
    exact: bool = True


@dataclass(frozen=True)
class Escalated:
    """The restart in progress moved to another rung (a pod lost while it waited)."""

    at: datetime
    rung: Rung


@dataclass(frozen=True)
class Suspended:
    at: datetime


@dataclass(frozen=True)
class Finished:
    """The job ended at `at`; `failed_at`: it ended by a failure at that time (`exact` as for
    Failed)."""

    at: datetime
    failed_at: datetime | None = None
    exact: bool = True


Event = Tick | Queued | Launched | Placed | Record | Failed | Escalated | Suspended | Finished


# --- the fold ----------------------------------------------------------------------------------


@dataclass
class InFlight:
    """[start, end] was counted as recomputed at attempt `attempt`'s failure: the time from the
    last record the operator had seen (after step `iteration`, `save_seen` ms of saves) to the
    failure."""

    attempt: int
    start: int
    end: int
    iteration: int
    save_seen: int


@dataclass
class Ledger:
    origin: datetime
    end: int = 0  # ms since origin: the latest time seen (the wall time)
    closed: int = 0  # ms since origin attributed so far
    ms: dict[Cause, int] = field(default_factory=dict)  # closed ms by cause
    mode: Mode = Mode.QUEUED
    attempt: int = 0
    rung: Rung | None = None  # of the restart in progress (or being recovered from)
    last_iteration: int = 0  # in TRAINING: the step the open interval starts after
    save_seen: int = 0  # ms of blocking saves of this attempt already attributed
    high: int = 0  # the highest step completed by any attempt
    failed_at: int | None = None  # a failure whose recovery (to the next first step) is open
    restarts: dict[Rung, tuple[int, int]] = field(default_factory=dict)  # rung → (count, ms)
    trained_steps: int = 0
    step_us: int | None = None  # recent microseconds per step
    spacing: int | None = None  # ms between the records folded, recently
    in_flight: InFlight | None = None  # the work the last failure interrupted (see _late)
    stopped: InFlight | None = None  # a training attempt a suspend or requeue stopped

    @classmethod
    def start(cls, origin: datetime, mode: Mode = Mode.QUEUED) -> Ledger:
        return cls(origin=origin.astimezone(UTC), mode=mode)

    # --- reading
    def seconds(self) -> dict[Cause, float]:
        """Every cause's seconds; the open interval is `unattributed`. They sum to the wall."""
        out = {c: self.ms.get(c, 0) / 1000 for c in Cause}
        out[Cause.UNATTRIBUTED] = (
            self.ms.get(Cause.UNATTRIBUTED, 0) + self.end - self.closed
        ) / 1000
        return out

    @property
    def wall(self) -> float:
        return self.end / 1000

    @property
    def goodput(self) -> float | None:
        return self.ms.get(Cause.PRODUCTIVE, 0) / self.end if self.end > 0 else None

    @property
    def as_of(self) -> datetime:
        return self.origin + timedelta(milliseconds=self.end)

    @property
    def step_seconds(self) -> float | None:
        return self.step_us / 1e6 if self.step_us is not None else None

    # --- time
    def _ms(self, when: datetime) -> int:
        seconds = (when - self.origin).total_seconds()
        return round(min(max(seconds, 0.0), _MAX_MS / 1000) * 1000)

    def _now(self, when: datetime) -> int:
        """An operator fact's time: never before the cursor; it moves the wall time on."""
        at = max(self._ms(when), self.closed)
        self.end = max(self.end, at)
        return at

    def _within(self, when: datetime, low: int) -> int:
        """A pod's or the trainer's time, inside [low, end]: no such fact lies in our future."""
        return min(max(self._ms(when), low), max(self.end, low))

    def _maybe(self, when: datetime | None, low: int) -> int | None:
        return self._within(when, low) if when is not None else None

    def _close(self, to: int, rest: Cause, *parts: tuple[Cause, int]) -> None:
        """Attribute [closed, to]: each part in turn (as much of it as fits), the rest to
        `rest`."""
        left = max(to - self.closed, 0)
        for cause, amount in (*parts, (rest, left)):
            take = min(max(amount, 0), left)
            if take:
                self.ms[cause] = self.ms.get(cause, 0) + take
                left -= take
        self.closed = max(self.closed, to)

    def _restart_cause(self) -> Cause:
        return RESTART_CAUSES.get(self.rung or Rung.RECREATE, Cause.RESTART_RECREATE)

    def _mode_cause(self) -> Cause:
        """The cause of time spent in the current mode when nothing finer is known."""
        if self.mode == Mode.RESTARTING:
            return self._restart_cause()
        if self.mode == Mode.STARTING:
            return Cause.START_UP
        if self.mode == Mode.SCHEDULING:
            return Cause.SCHEDULING
        return _CERTAIN.get(self.mode, Cause.UNATTRIBUTED)

    # --- the events
    def apply(self, event: Event) -> None:
        if self.mode == Mode.DONE and not isinstance(event, Launched):
            return  # the wall time stopped at the end (a revived job starts it again)
        match event:
            case Tick():
                self._now(event.at)
                if self.mode in _CERTAIN or self.mode == Mode.RESTARTING:
                    self._close(self.end, self._mode_cause())
            case Queued() | Suspended():
                at = self._now(event.at)
                # A stopped attempt saves on SIGTERM: its last steps are kept, not lost. What
                # it does after the decision counts to the stop until its final record says
                # which steps and save it finished (_late_stop).
                self.stopped = (
                    InFlight(self.attempt, at, at, self.last_iteration, self.save_seen)
                    if self.mode == Mode.TRAINING
                    else None
                )
                self._close(
                    at, Cause.PRODUCTIVE if self.mode == Mode.TRAINING else self._mode_cause()
                )
                self.mode = Mode.QUEUED if isinstance(event, Queued) else Mode.SUSPENDED
                self.failed_at = None
            case Launched():
                self._launched(event)
            case Placed():
                if self.mode == Mode.SCHEDULING and event.attempt == self.attempt:
                    self._close(self._within(event.at, self.closed), Cause.SCHEDULING)
                    self.mode = Mode.STARTING
            case Record():
                self._record(event)
            case Failed():
                self._failed(event)
            case Escalated():
                if self.mode == Mode.RESTARTING and event.rung != self.rung:
                    self._close(self._now(event.at), self._restart_cause())
                    if self.rung is not None:
                        self._count(self.rung, -1, 0)
                    self._count(event.rung, 1, 0)
                    self.rung = event.rung
            case Finished():
                self._finished(event)

    def _count(self, rung: Rung, count: int, ms: int) -> None:
        n, total = self.restarts.get(rung, (0, 0))
        self.restarts[rung] = (max(n + count, 0), total + ms)
        if self.restarts[rung] == (0, 0):
            del self.restarts[rung]  # as the status form has it: no entry

    def _launched(self, event: Launched) -> None:
        if self.mode == Mode.DONE:
            self.end = max(self.end, self._ms(event.at))  # the time it lay finished
            self._close(self.end, Cause.UNATTRIBUTED)
        at = self._now(event.at)
        cause = Cause.UNATTRIBUTED if self.mode == Mode.TRAINING else self._mode_cause()
        self._close(at, cause)
        self.mode = Mode.SCHEDULING
        self.attempt = max(event.attempt, 0)
        self.save_seen = 0
        self.stopped = None  # its final record, if it comes now, is of an attempt gone by

    def _record(self, r: Record) -> None:
        if r.attempt != self.attempt or self.mode not in (
            Mode.SCHEDULING,
            Mode.STARTING,
            Mode.TRAINING,
        ):
            if self.in_flight is not None and r.attempt == self.in_flight.attempt:
                self._late(r)
            elif (
                self.stopped is not None
                and r.attempt == self.stopped.attempt
                and self.mode in (Mode.SUSPENDED, Mode.QUEUED)
            ):
                self._late_stop(r)
            return  # a late write of another attempt, or of ranks already stopped
        at = self._within(r.at, self.closed)
        if self.mode == Mode.SCHEDULING:  # placed before the operator looked (no pod facts)
            first = min(x for x in (r.began, r.loop, r.at) if x is not None)
            self._close(self._within(first, self.closed), Cause.SCHEDULING)
            self.mode = Mode.STARTING
        if self.mode == Mode.STARTING:
            self._first_record(r, at)
            return
        self._train(r, at)

    def _first_record(self, r: Record, at: int) -> None:
        """The attempt's first step: its start-up, split by the process's timeline."""
        began = self._maybe(r.began, self.closed)
        loop = self._maybe(r.loop, began if began is not None else self.closed)
        if began is not None:
            self._close(began, Cause.START_UP)
        if began is not None and loop is not None:
            rendezvous, load = _ms_of(r.rendezvous), _ms_of(r.load)
            self._close(
                loop, Cause.START_UP, (Cause.RENDEZVOUS, rendezvous), (Cause.CHECKPOINT_LOAD, load)
            )
            start = r.start if r.start is not None else r.iteration
        else:
            # No timeline (code that reports only its steps, or an older trainer): up to its
            # first step, nothing says where the time went inside the process.
            self._close(at, Cause.NOT_REPORTED)
            start = r.iteration
        if self.failed_at is not None and self.rung is not None:
            self._count(self.rung, 0, max(self.closed - self.failed_at, 0))
        self.failed_at = None
        # The next attempt trains: from here its steps are told apart by `high`, which a late
        # record of the failed attempt could no longer correct.
        self.in_flight = None
        self.mode = Mode.TRAINING
        self.last_iteration = start
        self.save_seen = 0
        self._train(r, at)

    def _train(self, r: Record, at: int) -> None:
        """The open interval up to this record: blocking saves, then steps trained again
        (up to the highest step ever reached) and new steps, in proportion."""
        split = self._split(r, self.last_iteration, self.save_seen, max(at - self.closed, 0))
        if split is None:
            return  # nothing new: the interval stays open
        steps, stall, rest, again = split
        dt = stall + rest
        self._close(at, Cause.PRODUCTIVE, (Cause.CHECKPOINT_SAVE, stall), (Cause.RECOMPUTED, again))
        if steps:
            self.spacing = dt if self.spacing is None else self.spacing + (dt - self.spacing) // 4
        self.trained_steps += steps
        self.last_iteration = max(self.last_iteration, r.iteration)
        self.high = max(self.high, r.iteration)
        self.save_seen = max(self.save_seen, _ms_of(r.save))

    def _split(
        self, r: Record, after: int, save_seen: int, dt: int
    ) -> tuple[int, int, int, int] | None:
        """How `dt` ms up to record `r`, from step `after` with `save_seen` ms of saves counted,
        divide: (new steps, blocking saves, the rest, the part of the rest that trained steps
        again, up to the highest step ever reached, in proportion). None: nothing new. Notes the
        step time."""
        steps = r.iteration - after
        save = _ms_of(r.save) - save_seen
        if steps <= 0 and save <= 0:
            return None
        steps = max(steps, 0)
        stall = min(max(save, 0), dt)
        rest = dt - stall
        replay = min(max(min(r.iteration, self.high) - after, 0), steps)
        if steps:
            self._step_time(rest, steps)
            return steps, stall, rest, rest * replay // steps
        return steps, stall, rest, rest if after < self.high else 0

    def _step_time(self, ms: int, steps: int) -> None:
        us = ms * 1000 // steps
        if self.step_us is None:
            self.step_us = us
        else:  # recent steps weigh more: about the last 20 steps
            self.step_us += (us - self.step_us) * min(steps, 20) // 20

    def _lost_until(self, failed: int, exact: bool) -> int:
        """Where the work a failure interrupted ends: at the failure, when a first-hand source
        timed it; else at most a record interval and a step after the last record (the job
        cannot have trained unseen for longer: beyond that it waited to be found failed)."""
        if exact or self.mode != Mode.TRAINING or self.spacing is None:
            return failed
        return min(failed, self.closed + self.spacing + (self.step_us or 0) // 1000)

    def _late(self, r: Record) -> None:
        """A record of the failed attempt that reached the operator after the failure (the
        Lease is written at most every record interval; a rank that stops sends the newest it
        held back). The steps it finished before the failure were new work, not work in flight:
        their share of the interval counted as recomputed moves to productive (and its saves to
        checkpointSave), split as `_train` splits it; the rest stays recomputed."""
        f = self.in_flight
        assert f is not None
        at = min(max(self._ms(r.at), f.start), f.end)
        split = self._split(r, f.iteration, f.save_seen, at - f.start)
        if split is None:
            return  # nothing new (the same record, read again)
        steps, stall, rest, again = split
        self._move(
            Cause.RECOMPUTED, (Cause.CHECKPOINT_SAVE, stall), (Cause.PRODUCTIVE, rest - again)
        )
        self.trained_steps += steps
        self.high = max(self.high, r.iteration)
        self.in_flight = InFlight(
            f.attempt, at, f.end, max(f.iteration, r.iteration), max(f.save_seen, _ms_of(r.save))
        )

    def _move(self, source: Cause, *parts: tuple[Cause, int]) -> None:
        """Re-attribute seconds already counted to `source`: each part in turn, as much of it
        as `source` still holds (a cause's seconds never go below zero)."""
        for target, amount in parts:
            take = min(max(amount, 0), self.ms.get(source, 0))
            if take:
                self.ms[source] -= take
                self.ms[target] = self.ms.get(target, 0) + take

    def _late_stop(self, r: Record) -> None:
        """A record of an attempt that a suspend or requeue stopped, written as it stopped:
        the steps it finished after the decision were new work and its save on SIGTERM a
        blocking save, not time suspended (or queued). The stretch from the decision to the
        record moves to them; the rest (the signal on its way, the exit) stays the stop's."""
        f = self.stopped
        assert f is not None
        cause = Cause.SUSPENDED if self.mode == Mode.SUSPENDED else Cause.QUEUED
        at = min(max(self._ms(r.at), f.start), self.end)
        steps = max(r.iteration - f.iteration, 0)
        save = _ms_of(r.save) - f.save_seen
        if steps == 0 and save <= 0:
            return  # nothing new (the same record, read again)
        dt = at - f.start
        stall = min(max(save, 0), dt)
        rest = dt - stall if steps else 0  # no step finished: it was stopping, not training
        replay = min(max(min(r.iteration, self.high) - f.iteration, 0), steps)
        again = rest * replay // steps if steps else 0
        self._move(
            cause,
            (Cause.CHECKPOINT_SAVE, stall),
            (Cause.RECOMPUTED, again),
            (Cause.PRODUCTIVE, rest - again),
        )
        self.trained_steps += steps
        self.high = max(self.high, r.iteration)
        self.stopped = InFlight(
            f.attempt, at, f.end, max(f.iteration, r.iteration), max(f.save_seen, _ms_of(r.save))
        )

    def _failed(self, event: Failed) -> None:
        at = self._now(event.at)
        failed = min(max(self._ms(event.failed_at), self.closed), at)
        failed = self._lost_until(failed, event.exact)
        lost = {
            Mode.TRAINING: Cause.RECOMPUTED,
            Mode.STARTING: Cause.START_UP,
            Mode.SCHEDULING: Cause.SCHEDULING,
        }.get(self.mode)
        if lost is None:  # already restarting, or stopped: its own cause
            self._close(at, self._mode_cause())
            failed = at
        else:
            start = self.closed
            self._close(failed, lost)
            if lost == Cause.RECOMPUTED and failed > start:
                self.in_flight = InFlight(
                    self.attempt, start, failed, self.last_iteration, self.save_seen
                )
        self.rung = event.rung
        self._close(at, Cause.HANG_DETECTION if event.hang else self._restart_cause())
        self._count(event.rung, 1, 0)
        if self.failed_at is None:
            self.failed_at = failed
        self.mode = Mode.RESTARTING

    def _finished(self, event: Finished) -> None:
        at = self._now(event.at)
        if self.mode == Mode.TRAINING:
            if event.failed_at is not None:
                failed = min(max(self._ms(event.failed_at), self.closed), at)
                self._close(self._lost_until(failed, event.exact), Cause.RECOMPUTED)
            self._close(at, Cause.FINISHING)
        else:
            self._close(at, self._mode_cause())
        self._close(self.end, Cause.FINISHING)  # a tick already past the end
        self.mode = Mode.DONE
        self.failed_at = None

    # --- the status form (exact: every offset is whole milliseconds)
    def to_status(self) -> dict[str, Any]:
        seconds = self.seconds()
        goodput = self.goodput
        fold: dict[str, Any] = {
            "mode": str(self.mode),
            "attempt": self.attempt,
            "closed": self.closed / 1000,
            "lastIteration": self.last_iteration,
            "saveSeen": self.save_seen / 1000,
            "high": self.high,
            "trainedSteps": self.trained_steps,
        }
        if self.rung is not None:
            fold["rung"] = str(self.rung)
        if self.failed_at is not None:
            fold["failedAt"] = self.failed_at / 1000
        if self.step_us is not None:
            fold["stepSeconds"] = self.step_us / 1e6
        if self.spacing is not None:
            fold["recordSeconds"] = self.spacing / 1000
        for key, interval in (("inFlight", self.in_flight), ("stopped", self.stopped)):
            if interval is not None:
                fold[key] = {
                    "attempt": interval.attempt,
                    "start": interval.start / 1000,
                    "end": interval.end / 1000,
                    "iteration": interval.iteration,
                    "saveSeen": interval.save_seen / 1000,
                }
        out: dict[str, Any] = {
            "since": _stamp(self.origin),
            "asOf": _stamp(self.as_of),
            "wallSeconds": self.wall,
            "seconds": {str(c): v for c, v in seconds.items() if v},
            "summary": summary(goodput),
            "fold": fold,
        }
        if goodput is not None:
            out["goodput"] = round(goodput, 6)
        restarts = [
            {"rung": str(r), "count": n, "seconds": ms / 1000}
            for r, (n, ms) in sorted(self.restarts.items())
            if n or ms
        ]
        if restarts:
            out["restarts"] = restarts
        return out

    @classmethod
    def read(cls, raw: object) -> Ledger | None:
        """The ledger a status holds, or None when it holds none or one this code cannot use
        (never raises). Its sums are checked: a hand-edited ledger is not folded further."""
        if not isinstance(raw, Mapping):
            return None
        fold = raw.get("fold")
        seconds = raw.get("seconds")
        origin = parse_time(raw.get("since"))
        if not isinstance(fold, Mapping) or not isinstance(seconds, Mapping) or origin is None:
            return None
        try:
            mode = Mode(str(fold.get("mode")))
            rung = Rung(fold["rung"]) if fold.get("rung") is not None else None
        except ValueError:
            return None
        end = _ms_in(raw.get("wallSeconds"))
        closed = _ms_in(fold.get("closed"))
        numbers = [
            _int_in(fold.get(k)) for k in ("attempt", "lastIteration", "high", "trainedSteps")
        ]
        save = _ms_in(fold.get("saveSeen"))
        if end is None or closed is None or save is None or None in numbers or closed > end:
            return None
        ms: dict[Cause, int] = {}
        for key, value in seconds.items():
            amount = _ms_in(value)
            if amount is None or key not in tuple(Cause):
                return None
            if amount:
                ms[Cause(key)] = amount
        ms[Cause.UNATTRIBUTED] = ms.get(Cause.UNATTRIBUTED, 0) - (end - closed)
        if ms[Cause.UNATTRIBUTED] < 0 or sum(ms.values()) != closed:
            return None
        if not ms[Cause.UNATTRIBUTED]:
            del ms[Cause.UNATTRIBUTED]
        restarts: dict[Rung, tuple[int, int]] = {}
        for item in raw.get("restarts") or []:
            if not isinstance(item, Mapping) or item.get("rung") not in tuple(Rung):
                return None
            n, cost = _int_in(item.get("count")), _ms_in(item.get("seconds"))
            if n is None or cost is None:
                return None
            restarts[Rung(item["rung"])] = (n, cost)
        failed_at = _ms_in(fold.get("failedAt")) if fold.get("failedAt") is not None else None
        spacing = (
            _ms_in(fold.get("recordSeconds")) if fold.get("recordSeconds") is not None else None
        )
        step = fold.get("stepSeconds")
        step_us = (
            _int_in(round(step * 1e6)) if isinstance(step, (int, float)) and _number(step) else None
        )
        attempt, last, high, trained = (n for n in numbers if n is not None)
        in_flight = _in_flight(fold.get("inFlight"), closed)
        stopped = _in_flight(fold.get("stopped"), closed)
        return cls(
            origin=origin,
            end=end,
            closed=closed,
            ms=ms,
            mode=mode,
            attempt=attempt,
            rung=rung,
            last_iteration=last,
            save_seen=save,
            high=high,
            failed_at=failed_at,
            restarts=restarts,
            trained_steps=trained,
            step_us=step_us,
            spacing=spacing,
            in_flight=in_flight,
            stopped=stopped,
        )


def _in_flight(raw: object, closed: int) -> InFlight | None:
    """A status's in-flight interval, or None when absent or unusable (the late record is then
    ignored, as before: never a wrong fold)."""
    if not isinstance(raw, Mapping):
        return None
    attempt, iteration = _int_in(raw.get("attempt")), _int_in(raw.get("iteration"))
    start, end, save = (_ms_in(raw.get(k)) for k in ("start", "end", "saveSeen"))
    if attempt is None or iteration is None or start is None or end is None or save is None:
        return None
    if not start <= end <= closed:
        return None
    return InFlight(attempt, start, end, iteration, save)


def fold(ledger: Ledger, events: Iterable[Event]) -> Ledger:
    """The ledger after these events (the one given is not changed)."""
    out = copy.deepcopy(ledger)
    for event in events:
        out.apply(event)
    return out


def summary(goodput: float | None) -> str:
    return f"{goodput:.1%}" if goodput is not None else "-"


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ms_of(seconds: float | None) -> int:
    if seconds is None:
        return 0
    return round(min(max(seconds, 0.0), _MAX_MS / 1000) * 1000)


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and 0 <= value <= _MAX_MS / 1000
    )


def _ms_in(value: object) -> int | None:
    """Seconds (whole milliseconds) from a status, as ms; None when not a sane number."""
    return round(float(value) * 1000) if _number(value) else None  # type: ignore[arg-type]


def _int_in(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_MS
    return value if ok else None  # type: ignore[return-value]
