"""The forecast (core/forecast.py): Meta's expected-time-to-train model over what the ledger
measured, and `mjob goodput`'s text. Under a second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from megatron_operator.api.status import Cause, Rung
from megatron_operator.cli.goodput import MARKS, bar, render
from megatron_operator.core.forecast import (
    PRIOR_HOURS,
    Inputs,
    duration,
    estimate,
    for_job,
    prior_rate,
)
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.ledger import Ledger, Mode

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


def inputs(**changes: object) -> Inputs:
    base: dict[str, object] = {
        "remaining_steps": 10_000,
        "step_seconds": 6.0,
        "save_seconds_per_step": 0.0,
        "failures": 0,
        "exposure_seconds": 0.0,
        "recovery_seconds": 0.0,
        "lost_seconds": 0.0,
        "first_start_seconds": 300.0,
        "save_interval": 500,
        "gpus": 1024,
    }
    return Inputs(**{**base, **changes})  # type: ignore[arg-type]


def test_a_young_job_starts_from_metas_mttf() -> None:
    e = estimate(inputs())
    assert prior_rate(1024) == pytest.approx(1 / (7.9 * 3600))
    assert e.rate_per_hour == pytest.approx(1 / 7.9)
    # A failure costs the first start-up and half a checkpoint interval of steps.
    assert e.cost == pytest.approx(300 + 500 * 6 / 2)
    assert e.blind == 60_000
    assert e.remaining == pytest.approx(60_000 / (1 - e.rate_per_hour / 3600 * e.cost))
    assert e.p90 > e.remaining


def test_the_jobs_own_record_outweighs_the_prior_as_it_grows() -> None:
    """A 16-GPU job (Meta's MTTF: 505 h) that failed 24 times in 24 hours: its own rate wins."""
    e = estimate(inputs(gpus=16, failures=24, exposure_seconds=24 * 3600))
    prior = prior_rate(16) * 3600
    assert prior < 0.002
    expected = (prior * PRIOR_HOURS + 24) / (PRIOR_HOURS + 24)
    assert e.rate_per_hour == pytest.approx(expected)
    assert e.rate_per_hour > 0.79


def test_measured_costs_replace_the_prior_cost() -> None:
    e = estimate(inputs(failures=9, recovery_seconds=9 * 120.0, lost_seconds=9 * 600.0))
    prior = 300 + 500 * 6 / 2
    assert e.cost == pytest.approx((prior + 9 * 720) / 10)


def test_a_job_that_barely_progresses_has_a_bounded_forecast() -> None:
    e = estimate(inputs(failures=1000, exposure_seconds=3600, recovery_seconds=1000 * 3600.0))
    assert e.remaining == pytest.approx(e.blind / (1 - 0.95))
    assert e.p90 >= e.remaining
    huge = estimate(inputs(remaining_steps=10**9, step_seconds=10**8))
    assert huge.remaining <= 100 * 365 * 86400


def test_for_job_needs_train_iters_and_a_measured_step() -> None:
    ledger = Ledger.start(T0, Mode.TRAINING)
    st = JobStatus(gpus=8, progress={"iteration": 40})
    spec = {"training": {"trainIters": 100}, "checkpoint": {"saveInterval": 10}}
    assert for_job(ledger, st, spec, T0) is None  # no step measured yet
    ledger.step_us, ledger.trained_steps, ledger.high = 2_000_000, 40, 40
    ledger.end = ledger.closed = 100_000
    ledger.ms = {Cause.PRODUCTIVE: 80_000, Cause.START_UP: 20_000}
    out = for_job(ledger, st, spec, T0)
    assert out is not None
    assert out["blindSeconds"] == 120.0 and out["stepSeconds"] == 2.0
    assert out["eta"] == (T0 + timedelta(seconds=out["remainingSeconds"])).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    assert out["summary"].startswith("2m (p90 ")
    assert for_job(ledger, st, {"training": None}, T0) is None  # a trainer.command without it
    ledger.mode = Mode.DONE
    assert for_job(ledger, st, spec, T0) is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (59.4, "59s"),
        (61, "1m"),
        (3 * 3600 + 5 * 60, "3h05m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
    ],
)
def test_durations_read_at_a_glance(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_bar_gives_each_cause_its_share() -> None:
    line = bar({"productive": 75.0, "recomputed": 20.0, "restartRecreate": 5.0}, 20)
    assert line == "█" * 15 + "r" * 4 + "x"
    assert len(bar({"productive": 1.0, "queued": 0.001}, 60)) == 60
    assert len(set(MARKS.values())) == len(MARKS) == len(Cause)


def test_mjob_goodput_tells_where_the_time_went() -> None:
    ledger = Ledger.start(T0)
    ledger.end = ledger.closed = 1_000_000
    ledger.ms = {
        Cause.PRODUCTIVE: 900_000,
        Cause.RESTART_IN_PLACE: 60_000,
        Cause.RECOMPUTED: 40_000,
    }
    ledger.restarts = {Rung.IN_PLACE: (2, 130_000)}
    status = {
        "ledger": ledger.to_status(),
        "forecast": {
            "summary": "2h10m (p90 2h40m)",
            "eta": "2026-11-22T16:00:00Z",
            "etaP90": "2026-11-22T16:30:00Z",
            "blindSeconds": 7000.0,
            "failuresPerHour": 0.5,
            "secondsPerFailure": 190.0,
        },
    }
    text = render("team/llama", status)
    assert text.startswith("team/llama: goodput 90.0% of 16m wall time")
    assert "productive                 900.0    90.0%  █" in text
    assert "InPlace: 2, 130.0s, 65.0s each" in text
    assert "forecast: 2h10m (p90 2h40m) to go" in text and "without failures 1h56m" in text
    assert "no goodput ledger yet" in render("x", {})
