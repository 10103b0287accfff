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
    # Every reason by every rung (InPlace, ReplacePod, Recreate).
    assert len(restarts) == len(RESTART_SERIES) == 3 * len(RESTART_REASONS)
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
