"""The goodput ledger (core/ledger.py): a pure fold over the job's facts.

Properties over any event order (hypothesis): the causes sum to the wall time exactly, none is
negative, none but `unattributed` ever decreases, and the status form round-trips exactly (an
operator that restarts between any two events continues the same fold). Then timelines whose
attribution is known to the millisecond. About 3 s in all.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_operator.api.status import Cause, Rung
from megatron_operator.api.status import Ledger as LedgerModel
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

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# --- any event order -------------------------------------------------------------------------

times = st.floats(min_value=-50, max_value=2000, allow_nan=False).map(lambda s: t(round(s, 3)))
maybe_time = st.none() | times
attempts = st.integers(0, 3)
steps = st.integers(0, 60)
durations = st.none() | st.floats(min_value=0, max_value=100, allow_nan=False)
rungs = st.sampled_from(list(Rung))

events: st.SearchStrategy[Event] = st.one_of(
    st.builds(Tick, times),
    st.builds(Queued, times),
    st.builds(Suspended, times),
    st.builds(Launched, times, attempts),
    st.builds(Placed, times, attempts),
    st.builds(
        Record,
        times,
        attempts,
        steps,
        began=maybe_time,
        loop=maybe_time,
        start=st.none() | steps,
        rendezvous=durations,
        load=durations,
        save=durations,
    ),
    st.builds(Failed, times, times, rungs, st.booleans(), st.booleans()),
    st.builds(Escalated, times, rungs),
    st.builds(Finished, times, maybe_time, st.booleans()),
)


def named(ledger: Ledger) -> dict[Cause, int]:
    return {c: ms for c, ms in ledger.ms.items() if c != Cause.UNATTRIBUTED}


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=40))
def test_any_event_order_sums_to_the_wall_never_negative_monotone(seq: list[Event]) -> None:
    ledger = Ledger.start(T0)
    for event in seq:
        before = Ledger.read(ledger.to_status())
        assert before == ledger  # the status form is exact: an operator restart changes nothing
        ledger.apply(event)
        seconds = ledger.seconds()
        total_ms = sum(ledger.ms.values()) + ledger.end - ledger.closed
        assert total_ms == ledger.end  # exact, in whole milliseconds
        assert abs(sum(seconds.values()) - ledger.wall) < 1e-6
        assert all(v >= 0 for v in seconds.values()), seconds
        assert ledger.closed <= ledger.end and before.end <= ledger.end
        for cause, ms in named(before).items():
            if cause != Cause.RECOMPUTED:
                assert ledger.ms.get(cause, 0) >= ms, (cause, event)
        # Recomputed time gives back only what a late record shows was new work or a save.
        gone = before.ms.get(Cause.RECOMPUTED, 0) - ledger.ms.get(Cause.RECOMPUTED, 0)
        if gone > 0:
            gained = [
                ledger.ms.get(c, 0) - before.ms.get(c, 0)
                for c in (Cause.PRODUCTIVE, Cause.CHECKPOINT_SAVE)
            ]
            assert isinstance(event, Record) and sum(gained) == gone and min(gained) >= 0
        assert ledger.closed >= before.closed
        LedgerModel.model_validate(ledger.to_status(), strict=False)  # what the CRD schema accepts


def test_fold_leaves_its_input_alone() -> None:
    start = Ledger.start(T0)
    out = fold(start, [Tick(t(10)), Launched(t(10), 0)])
    assert start.end == 0 and out.end == 10_000


def test_an_unusable_status_ledger_is_not_folded() -> None:
    good = fold(Ledger.start(T0), [Launched(t(5), 0), Tick(t(9))]).to_status()
    assert Ledger.read(good) is not None
    for broken in (
        {**good, "seconds": {**good["seconds"], "queued": 99.0}},  # no longer sums
        {**good, "seconds": {"bogus": 1.0}},
        {**good, "fold": {**good["fold"], "mode": "Dancing"}},
        {**good, "wallSeconds": -1},
        {**good, "wallSeconds": True},
        {**good, "since": "yesterday"},
        {**good, "restarts": [{"rung": "Sideways", "count": 1, "seconds": 1}]},
        "ledger",
        None,
        [],
    ):
        assert Ledger.read(broken) is None


# --- timelines with a known answer -----------------------------------------------------------


def secs(ledger: Ledger) -> dict[str, float]:
    return {str(c): round(v, 3) for c, v in ledger.seconds().items() if v}


def test_a_job_that_trains_restarts_in_place_and_succeeds() -> None:
    """Created at 0; pods created at 1 and bound at 3; the process began at 5, its rendezvous
    took 2 s and its load 4 s, so its loop began at 15 (fresh: after step 0); steps 1-10 by 25
    (a save of 1 s at step 10 inside), step 12 at 27.5; a rank dies at 28, the restart is
    decided at 28.5 and released at 30.5; attempt 1 resumes after step 10 (the checkpoint) and
    reaches step 12 at 40 with its loop begun at 36 (began 31, rendezvous 1, load 2); step 20
    at 48; the job ends at 50."""
    events: list[Event] = [
        Tick(t(1)),
        Launched(t(1), 0),
        Tick(t(28.5)),  # the shell hands in its now first: no fact lies beyond it
        Placed(t(3), 0),
        Record(t(25), 0, 10, began=t(5), loop=t(15), start=0, rendezvous=2, load=4, save=1),
        Record(t(27.5), 0, 12, began=t(5), loop=t(15), start=0, rendezvous=2, load=4, save=1),
        Failed(t(28.5), t(28), Rung.IN_PLACE),
        Tick(t(30.5)),
        Launched(t(30.5), 1),
        Placed(t(2), 1),  # the same pods, bound long ago: clamped to the release
        Tick(t(40)),
        Record(t(40), 1, 12, began=t(31), loop=t(36), start=10, rendezvous=1, load=2, save=0),
        Tick(t(48)),
        Record(t(48), 1, 20, began=t(31), loop=t(36), start=10, rendezvous=1, load=2, save=0),
        Tick(t(50)),
        Finished(t(50)),
        Tick(t(60)),  # after the end: the wall time stopped at 50
    ]
    ledger = fold(Ledger.start(T0), events)
    assert ledger.mode == Mode.DONE and ledger.wall == 50
    assert secs(ledger) == {
        "queued": 1.0,
        "scheduling": 2.0,  # 1 → 3
        "startUp": 2.0 + 4.0 + 0.5 + 2.0,  # 3 → 5, in process 15 - 5 - 2 - 4; 30.5 → 31, 34 → 36
        "rendezvous": 3.0,
        "checkpointLoad": 6.0,
        "checkpointSave": 1.0,
        # 25 → 27.5 trains 11-12; 27.5 → 28 is lost in flight; 36 → 40 trains 11-12 again
        "recomputed": 0.5 + 4.0,
        "restartInPlace": 2.5,  # 28 → 30.5
        "productive": 9.0 + 2.5 + 8.0,  # 15 → 25 less the save, 25 → 27.5, 40 → 48
        "finishing": 2.0,
    }
    assert abs(ledger.goodput - 19.5 / 50) < 1e-9  # type: ignore[operator]
    # The restart's recovery: from the failure (28) to attempt 1's first step (36).
    assert ledger.restarts == {Rung.IN_PLACE: (1, 8000)}


def test_open_time_is_unattributed_until_a_fact_says_where_it_went() -> None:
    ledger = fold(Ledger.start(T0), [Launched(t(0), 0), Tick(t(30)), Placed(t(2), 0)])
    assert secs(ledger) == {"scheduling": 2.0, "unattributed": 28.0}  # starting: not known yet
    ledger = fold(ledger, [Record(t(30), 0, 1, began=t(10), loop=t(28), start=0, load=3)])
    assert secs(ledger) == {
        "scheduling": 2.0,
        "startUp": 8.0 + 15.0,
        "checkpointLoad": 3.0,
        "productive": 2.0,
    }


def test_a_hang_waits_from_the_last_sign_of_life() -> None:
    ledger = fold(
        Ledger.start(T0),
        [
            Launched(t(0), 0),
            Placed(t(0), 0),
            Tick(t(10)),
            Record(t(10), 0, 5, began=t(0), loop=t(5), start=0),
            Tick(t(100)),
            Failed(t(100), t(10), Rung.RECREATE, hang=True),
            Tick(t(110)),
        ],
    )
    s = secs(ledger)
    assert s["hangDetection"] == 90.0 and s["restartRecreate"] == 10.0


def test_suspend_keeps_the_steps_and_counts_the_time_suspended() -> None:
    ledger = fold(
        Ledger.start(T0),
        [
            Launched(t(0), 0),
            Placed(t(0), 0),
            Tick(t(12)),
            Record(t(10), 0, 5, began=t(0), loop=t(5), start=0),
            Suspended(t(12)),
            Record(t(13), 0, 6, began=t(0), loop=t(5), start=0),  # the SIGTERM save's record
            Tick(t(100)),
            Launched(t(100), 1),
            Tick(t(101)),
        ],
    )
    s = secs(ledger)
    assert s["productive"] == 7.0 and s["suspended"] == 88.0 and s["unattributed"] == 1.0


def test_code_that_reports_only_its_steps() -> None:
    """A trainer.command: the launcher knows when the ranks began, and the steps; what happened
    inside the process before the first step is not reported by the code."""
    ledger = fold(
        Ledger.start(T0),
        [
            Launched(t(0), 0),
            Tick(t(30)),
            Placed(t(1), 0),
            Record(t(20), 0, 1, began=t(4)),
            Record(t(30), 0, 11),
        ],
    )
    assert secs(ledger) == {
        "scheduling": 1.0,
        "startUp": 3.0,
        "notReported": 16.0,
        "productive": 10.0,
    }


def test_a_late_fact_is_clamped_never_uncounted() -> None:
    ledger = fold(Ledger.start(T0), [Queued(t(0)), Tick(t(50)), Launched(t(20), 0)])
    assert secs(ledger) == {"queued": 50.0}  # admitted "at 20", seen at 50: queued until 50


def test_a_revived_job_counts_the_time_it_lay_failed() -> None:
    ledger = fold(Ledger.start(T0), [Launched(t(0), 0), Finished(t(10)), Launched(t(70), 1)])
    s = secs(ledger)
    assert s["unattributed"] == 60.0 and ledger.wall == 70 and ledger.mode == Mode.SCHEDULING


def test_status_form_matches_the_api_model() -> None:
    ledger = fold(
        Ledger.start(T0),
        [
            Tick(t(9)),
            Launched(t(1), 0),
            Placed(t(2), 0),
            Record(t(9), 0, 3, began=t(3), loop=t(6), start=0),
            Failed(t(10), t(9.5), Rung.REPLACE_POD),
        ],
    )
    raw: dict[str, Any] = ledger.to_status()
    model = LedgerModel.model_validate(raw, strict=False)
    assert model.to_api() == raw
    assert raw["restarts"] == [{"rung": "ReplacePod", "count": 1, "seconds": 0.0}]
    assert raw["summary"] == f"{ledger.goodput:.1%}"


def test_a_failure_noticed_late_loses_at_most_a_record_interval() -> None:
    """A node found lost 60 s after the last record (no first-hand time of the failure): the job
    trained unseen for at most a record interval and a step (10 s + 1 s here); the rest it
    waited to be found failed, which is the restart's downtime."""
    events: list[Event] = [Launched(t(0), 0), Tick(t(100)), Placed(t(0), 0)]
    for i in range(1, 5):  # records every 10 s, 10 steps each
        events.append(Record(t(10 * i), 0, 10 * i, began=t(0), loop=t(0), start=0))
    events.append(Failed(t(100), t(100), Rung.RECREATE, exact=False))
    ledger = fold(Ledger.start(T0), events)
    s = secs(ledger)
    assert ledger.spacing == 10_000 and ledger.step_us == 1_000_000
    assert s["recomputed"] == 11.0 and s["restartRecreate"] == 49.0
    exact = fold(Ledger.start(T0), [*events[:-1], Failed(t(100), t(100), Rung.RECREATE)])
    assert secs(exact)["recomputed"] == 60.0  # a first-hand failure time: all of it was work


def test_a_late_record_of_the_failed_attempt_moves_its_steps_back_to_productive() -> None:
    """The operator saw step 10 at 10 s (records every 10 s at most); a rank died at 15 s, after
    step 14 at 14 s. Rank 0's newest record (step 14, a 0.5 s save in it) reaches the operator
    only after the failure: 10 → 14 was new work and a save, 14 → 15 was in flight. Attempt 1
    then trains 11-14 again (recomputed, since the ledger now knows step 14 was reached)."""
    events: list[Event] = [Launched(t(0), 0), Tick(t(16)), Placed(t(0), 0)]
    events.append(Record(t(10), 0, 10, began=t(0), loop=t(0), start=0))
    events.append(Failed(t(16), t(15), Rung.RECREATE))
    seen_late = [*events, Record(t(14), 0, 14, began=t(0), loop=t(0), start=0, save=0.5)]
    late = fold(Ledger.start(T0), seen_late)
    s = secs(late)
    assert s["recomputed"] == 1.0 and s["productive"] == 10.0 + 3.5
    assert s["checkpointSave"] == 0.5 and late.high == 14
    # The same record read again changes nothing; the status form carries the interval.
    again = fold(Ledger.read(late.to_status()), [seen_late[-1]])  # type: ignore[arg-type]
    assert secs(again) == s
    # Attempt 1 resumes after step 10 and reaches 14 at 30, 16 at 32: 11-14 are recomputed.
    rest: list[Event] = [
        Tick(t(20)),
        Launched(t(20), 1),
        Tick(t(32)),
        Record(t(30), 1, 14, began=t(21), loop=t(26), start=10),
        Record(t(32), 1, 16, began=t(21), loop=t(26), start=10),
        seen_late[-1],  # too late now: attempt 1's steps were already told apart
    ]
    done = fold(late, rest)
    assert secs(done)["recomputed"] == 1.0 + 4.0 and done.in_flight is None
    # Without the late record, 10 → 15 was all in flight and 11-14 of attempt 1 looked new.
    blind = secs(fold(Ledger.start(T0), [*events, *rest[:-1]]))
    assert blind["recomputed"] == 5.0 and blind["productive"] == 10.0 + 2.0 + 4.0 - 0.0


def test_an_unusable_in_flight_interval_is_dropped_not_the_ledger() -> None:
    """The status is the tenant's to write too: a bad `fold.inFlight` (an interval past what was
    attributed, a wrong type) reads as none, so a late record is ignored as before."""
    events: list[Event] = [Launched(t(0), 0), Tick(t(16)), Placed(t(0), 0)]
    events += [
        Record(t(10), 0, 10, began=t(0), loop=t(0), start=0),
        Failed(t(16), t(15), Rung.RECREATE),
    ]
    raw = fold(Ledger.start(T0), events).to_status()
    assert raw["fold"]["inFlight"] == {
        "attempt": 0, "start": 10.0, "end": 15.0, "iteration": 10, "saveSeen": 0.0
    }  # fmt: skip
    for bad in ({**raw["fold"]["inFlight"], "end": 99.0}, {"attempt": "x"}, "late"):
        ledger = Ledger.read({**raw, "fold": {**raw["fold"], "inFlight": bad}})
        assert ledger is not None and ledger.in_flight is None
