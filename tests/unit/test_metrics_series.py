"""The per-job series: every restart counter exists at 0 from the job's first sight (so
`increase()` sees the first restart), the running-since and hang-timeout gauges follow the
status and spec, and a deleted job leaves no series behind."""

from __future__ import annotations

from prometheus_client import generate_latest

from megatron_operator.cluster.metrics import RESTART_REASONS, RESTART_SERIES, Metrics


def series(m: Metrics, name: str) -> dict[str, float]:
    out = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels[len(name) :]] = float(value)
    return out


def test_counters_start_at_zero_and_go_with_the_job() -> None:
    m = Metrics()
    m.observe_status("team", "a", {"phase": "Pending"}, {"restartPolicy": {}})
    restarts = series(m, "megatronjob_restarts_total")
    # Every reason by every rung (InPlace, SpareSwap, ReplacePod, Recreate).
    assert len(restarts) == len(RESTART_SERIES) == 4 * len(RESTART_REASONS)
    assert set(restarts.values()) == {0.0}
    assert '{name="a",namespace="team",reason="StartupTimeout",rung="Recreate"}' in restarts
    error = '{name="a",namespace="team",reason="Error",rung="InPlace"}'
    m.restarts.labels("team", "a", "Error", "InPlace").inc()
    assert series(m, "megatronjob_restarts_total")[error] == 1
    m.observe_status("team", "a", {"phase": "Pending"})  # seen again: nothing is reset
    assert series(m, "megatronjob_restarts_total")[error] == 1
    m.forget("team", "a")
    text = generate_latest(m.registry).decode()
    assert 'name="a"' not in text  # every series of the deleted job, counters included


def test_running_since_and_hang_timeout_follow_the_job() -> None:
    m = Metrics()
    running = {"phase": "Running", "runningSince": "2026-11-22T12:00:00Z"}
    m.observe_status("team", "b", running, {"restartPolicy": {"hangTimeoutSeconds": 600}})
    assert series(m, "megatronjob_running_since_timestamp_seconds") == {
        '{name="b",namespace="team"}': 1795348800.0
    }
    assert series(m, "megatronjob_hang_timeout_seconds") == {'{name="b",namespace="team"}': 600.0}
    m.observe_status("team", "b", {"phase": "Restarting"}, {})
    assert series(m, "megatronjob_running_since_timestamp_seconds") == {}  # not Running: absent
    assert series(m, "megatronjob_hang_timeout_seconds") == {'{name="b",namespace="team"}': 1800.0}


def test_a_job_without_a_progress_source_is_never_measured_as_idle() -> None:
    # trainer.progress None: no running-since series, so MegatronJobNoProgress has nothing to
    # measure from (its expression needs it), whatever the hang timeout.
    m = Metrics()
    running = {"phase": "Running", "runningSince": "2026-11-22T12:00:00Z"}
    spec = {"trainer": {"command": ["x"], "progress": "None"}, "restartPolicy": {}}
    m.observe_status("team", "c", running, spec)
    assert series(m, "megatronjob_running_since_timestamp_seconds") == {}
    spec["trainer"]["progress"] = "MegatronLog"
    m.observe_status("team", "c", running, spec)
    assert len(series(m, "megatronjob_running_since_timestamp_seconds")) == 1


def test_goodput_counters_follow_the_ledger_and_count_only_attributed_seconds() -> None:
    m = Metrics()
    ledger = {
        "wallSeconds": 100.0,
        "seconds": {"productive": 60.0, "startUp": 10.0, "unattributed": 30.0},
        "goodput": 0.6,
        "fold": {"closed": 75.0},  # 25 s open: 5 s were closed as unattributed
    }
    status = {
        "phase": "Running",
        "gpus": 16,
        "ledger": ledger,
        "forecast": {"remainingSeconds": 500.0, "p90Seconds": 800.0},
    }
    m.observe_status("team", "g", status)
    job = '{cause="%s",name="g",namespace="team"}'
    counters = series(m, "megatronjob_goodput_seconds_total")
    assert counters == {job % "productive": 60.0, job % "startUp": 10.0, job % "unattributed": 5.0}
    assert series(m, "megatronjob_goodput_ratio") == {'{name="g",namespace="team"}': 0.6}
    assert series(m, "megatronjob_gpus") == {'{name="g",namespace="team"}': 16.0}
    assert series(m, "megatronjob_forecast_remaining_seconds") == {
        '{name="g",namespace="team",quantile="0.5"}': 500.0,
        '{name="g",namespace="team",quantile="0.9"}': 800.0,
    }
    # The open interval attributed later: productive grows, nothing goes back.
    later = {**ledger, "wallSeconds": 110.0, "fold": {"closed": 110.0}}
    later["seconds"] = {"productive": 95.0, "startUp": 10.0, "unattributed": 5.0}
    m.observe_status("team", "g", {"phase": "Succeeded", "ledger": later})
    counters = series(m, "megatronjob_goodput_seconds_total")
    assert counters[job % "productive"] == 95.0 and counters[job % "unattributed"] == 5.0
    assert series(m, "megatronjob_forecast_remaining_seconds") == {}  # ended: no forecast
    m.forget("team", "g")
    assert 'name="g"' not in generate_latest(m.registry).decode()
