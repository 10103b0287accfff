"""The goodput ledger through the state machine (core/accounting.py): what a reconcile sees
becomes the ledger's facts, the ledger lives in the status (so it survives an operator restart),
and it costs at most one status write of its own per 30 s per job. About 2 s in all."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from megatron_contract.paths import PROGRESS_ANNOTATION
from megatron_operator.core.accounting import WRITE_SECONDS
from megatron_operator.core.ledger import Ledger
from megatron_operator.core.observe import format_time

from .sim import T0, Sim
from .specs import spec_of


def sim(**changes: Any) -> Sim:
    return Sim.of_spec(spec_of({"restartPolicy": {"strategy": "InPlace"}, **changes}))


def record(s: Sim, iteration: int, *, began: datetime, loop: datetime, start: int = 0) -> None:
    """Rank 0's record with its timeline, written at the sim's now."""
    assert s.lease is not None
    body = {
        "attempt": int(s.status.get("restartAttempt", 0)),
        "iteration": iteration,
        "time": format_time(s.now),
        "clock": {
            "now": s.now.timestamp(),
            "began": began.timestamp(),
            "loop": loop.timestamp(),
            "start": start,
            "rdzv": 1.0,
            "load": 2.0,
            "save": 0.0,
        },
    }
    s.lease["metadata"].setdefault("annotations", {})[PROGRESS_ANNOTATION] = json.dumps(body)
    s.lease["spec"] = {"holderIdentity": "job-0", "renewTime": format_time(s.now)}


def ledger(s: Sim) -> dict[str, Any]:
    raw = s.status["ledger"]
    assert abs(sum(raw["seconds"].values()) - raw["wallSeconds"]) < 1e-6
    return raw


def test_a_restarted_job_accounts_for_every_second() -> None:
    s = sim()
    s.job["metadata"]["creationTimestamp"] = format_time(T0)
    s.start_running()  # created, scheduled and running within a few simulated seconds
    start = s.now
    s.tick(20)
    record(s, 10, began=start + timedelta(seconds=1), loop=start + timedelta(seconds=10))
    s.step()
    s.tick(10)
    record(s, 20, began=start + timedelta(seconds=1), loop=start + timedelta(seconds=10))
    s.step()
    s.tick(1)
    s.report_launchers(failures=[(1, 137)])  # a rank of node 1 died
    s.step()
    assert s.status["phase"] == "Restarting" and s.status["lastFailure"]["rung"] == "InPlace"
    s.tick(60)
    s.step()  # the backoff is over: released in place
    assert s.status["restartAttempt"] == 1 and s.status["phase"] in ("Pending", "Running")
    released = s.now
    s.tick(20)
    record(
        s, 25, began=released + timedelta(seconds=1), loop=released + timedelta(seconds=5), start=10
    )
    s.step()
    raw = ledger(s)
    seconds = raw["seconds"]
    assert seconds["restartInPlace"] == 60.0  # from the rank's exit to the release
    # Attempt 1 resumed after step 10: steps 11-20 again (10 s), then 21-25 new (5 s); the
    # second between the last record (20) and the rank's exit was lost in flight.
    assert seconds["recomputed"] == 1.0 + 10.0
    assert seconds["productive"] == 20.0 + 5.0
    assert seconds["rendezvous"] == 2.0 and seconds["checkpointLoad"] == 4.0
    assert raw["restarts"] == [
        {"rung": "InPlace", "count": 1, "seconds": raw["restarts"][0]["seconds"]}
    ]
    assert raw["fold"]["attempt"] == 1 and raw["fold"]["mode"] == "Training"
    assert 0 < raw["goodput"] < 1 and raw["summary"].endswith("%")
    # The forecast beside it: 100 steps, 75 to go at ~1 s a step, with the failure it has seen.
    forecast = s.status["forecast"]
    assert forecast["stepSeconds"] == 1.0 and forecast["blindSeconds"] == 75.0
    assert forecast["remainingSeconds"] > forecast["blindSeconds"]  # one failure in 2 minutes
    assert forecast["p90Seconds"] >= forecast["remainingSeconds"]


def test_the_ledger_survives_an_operator_that_loses_what_it_did_not_write() -> None:
    """Reconciles whose status is never written (an operator that dies after deciding) change
    nothing: the next one folds from the status with the facts it sees then."""
    a, b = sim(), sim()
    for s in (a, b):
        s.start_running()
    for i in range(1, 30):
        for s in (a, b):
            s.tick(1)
            record(s, i, began=T0, loop=T0)
        a.step()
        b.step(write_status=i % 3 == 0)  # two reconciles in three are lost
    for s in (a, b):
        s.tick(WRITE_SECONDS)
        s.step()
    assert ledger(a)["seconds"] == ledger(b)["seconds"]


def test_the_ledger_writes_at_most_once_per_30_seconds_on_its_own() -> None:
    """A job that runs without reporting (nothing else in its status changes): reconciled every
    second for 10 minutes, its status is written by the ledger at most once per 30 s."""
    s = sim()
    s.start_running()
    writes = 0
    for _ in range(600):
        s.tick(1)
        before = s.status
        s.step()
        writes += s.status != before
    assert 600 / WRITE_SECONDS - 1 <= writes <= 600 / WRITE_SECONDS + 1


def test_the_ledger_rides_on_the_writes_the_status_makes_anyway() -> None:
    """A job that reports a step every second (the status copies progress every 10 s): the
    ledger adds no write; every status write carries a fresh ledger."""
    s = sim()
    s.start_running()
    ledger_only = 0
    for i in range(1, 301):
        s.tick(1)
        record(s, i, began=T0, loop=T0)
        before = s.status
        s.step()
        after = s.status
        strip = lambda d: {k: v for k, v in d.items() if k not in ("ledger", "forecast")}  # noqa: E731
        if after != before and strip(after) == strip(before):
            ledger_only += 1
        if strip(after) != strip(before):
            assert after["ledger"]["asOf"].startswith(format_time(s.now)[:19])
    assert ledger_only == 0


def test_a_job_without_a_ledger_starts_one_with_its_past_unattributed() -> None:
    """A job an older operator ran: the ledger begins at the first reconcile that sees it."""
    s = sim()
    s.job["metadata"]["creationTimestamp"] = format_time(T0)
    s.start_running()
    del s.job["status"]["ledger"]
    s.tick(100)
    s.step()
    raw = ledger(s)
    assert raw["seconds"] == {"unattributed": raw["wallSeconds"]}
    assert raw["fold"]["mode"] == "Training"
    parsed = Ledger.read(raw)
    assert parsed is not None and parsed.origin == T0


def test_a_finished_job_keeps_its_ledger_and_writes_no_more() -> None:
    s = sim()
    s.start_running()
    s.tick(5)
    record(s, 100, began=T0, loop=T0)
    s.step()
    s.succeed_all()
    s.tick(2)
    s.step()
    assert s.status["phase"] == "Succeeded"
    final = s.status["ledger"]
    assert final["fold"]["mode"] == "Done" and "forecast" not in s.status
    s.tick(3600)
    s.step()
    assert s.status["ledger"] == final


def test_a_hang_is_attributed_from_the_last_sign_of_life() -> None:
    s = sim(**{"restartPolicy": {"strategy": "InPlace", "hangTimeoutSeconds": 300}})
    s.start_running()
    s.tick(10)
    record(s, 5, began=s.now - timedelta(seconds=8), loop=s.now - timedelta(seconds=5))
    s.step()
    last = s.now
    s.tick(300)
    s.step()
    assert s.status["lastFailure"]["reason"] == "Hang"
    seconds = ledger(s)["seconds"]
    assert seconds["hangDetection"] == (s.now - last).total_seconds() == 300.0


def test_suspended_time_is_its_own() -> None:
    s = sim()
    s.start_running()
    s.tick(10)
    record(s, 10, began=s.now - timedelta(seconds=10), loop=s.now - timedelta(seconds=10))
    s.step()
    s.job["spec"]["suspend"] = True
    s.step()
    assert s.status["phase"] == "Suspended"
    s.finish_deletions()
    s.tick(600)
    s.job["spec"]["suspend"] = False
    s.step()
    assert s.status["phase"] == "Pending"
    seconds = ledger(s)["seconds"]
    assert seconds["suspended"] == 600.0 and seconds["productive"] == 10.0


def test_the_steps_and_save_of_a_stopping_attempt_are_not_time_suspended() -> None:
    """A suspend stops a training attempt: it finishes its step, saves on SIGTERM and sends its
    final record as it exits. That record moves the step and the save from the suspended time
    back to productive and checkpointSave; the rest of the stop stays suspended."""
    s = sim()
    s.start_running()
    began = s.now
    s.tick(10)
    record(s, 10, began=began, loop=began)
    s.step()
    s.tick(0.5)
    s.job["spec"]["suspend"] = True
    s.step()  # the decision: 0.5 s after the last record seen
    assert s.status["phase"] == "Suspended"
    s.tick(4)
    # Its final record: one more step (done 1 s after the decision), then a 2 s save.
    record(s, 11, began=began, loop=began)
    assert s.lease is not None
    body = json.loads(s.lease["metadata"]["annotations"][PROGRESS_ANNOTATION])
    body["clock"]["now"] = (s.now - timedelta(seconds=1)).timestamp()
    body["clock"]["save"] = 2.0
    s.lease["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(body)
    s.step()
    s.tick(1)
    s.step()  # the same record, read again (by every reconcile after): nothing moves twice
    s.finish_deletions()
    s.tick(600)
    s.job["spec"]["suspend"] = False
    s.step()
    seconds = ledger(s)["seconds"]
    assert seconds["productive"] == 10.0 + 0.5 + 1.0
    assert seconds["checkpointSave"] == 2.0
    assert seconds["suspended"] == 1.0 + 1.0 + 600.0  # the exit after the record, the pause
    assert ledger(s)["fold"].get("stopped") is None  # the resumed attempt was launched
