"""The per-job gauges the dashboard and alerts read come from status.progress."""

from __future__ import annotations

from datetime import UTC, datetime

from megatron_operator.cluster.metrics import Metrics


def value(m: Metrics, metric: str, /, **labels: str) -> float | None:
    return m.registry.get_sample_value(metric, labels)


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def progress(iteration: int, checkpoint: int | None, time: str) -> dict[str, object]:
    p: dict[str, object] = {"iteration": iteration, "loss": 2.5, "time": time}
    if checkpoint is not None:
        p["checkpointIteration"] = checkpoint
    return {"phase": "Running", "progress": p}


def test_progress_and_checkpoint_times() -> None:
    m = Metrics()
    job = {"namespace": "team-a", "name": "llama"}
    m.observe_status("team-a", "llama", progress(100, None, "2026-01-01T00:00:00Z"))
    assert value(m, "megatronjob_progress_timestamp_seconds", **job) == stamp(
        "2026-01-01T00:00:00Z"
    )
    assert value(m, "megatronjob_checkpoint_iteration", **job) is None

    m.observe_status("team-a", "llama", progress(200, 200, "2026-01-01T00:10:00Z"))
    assert value(m, "megatronjob_checkpoint_iteration", **job) == 200
    saved = stamp("2026-01-01T00:10:00Z")
    assert value(m, "megatronjob_last_checkpoint_timestamp_seconds", **job) == saved

    # Later reports of the same checkpoint do not make it younger.
    m.observe_status("team-a", "llama", progress(250, 200, "2026-01-01T00:20:00Z"))
    assert value(m, "megatronjob_last_checkpoint_timestamp_seconds", **job) == saved
    assert value(m, "megatronjob_progress_timestamp_seconds", **job) == stamp(
        "2026-01-01T00:20:00Z"
    )
    assert value(m, "megatronjob_iteration", **job) == 250

    m.observe_status("team-a", "llama", progress(300, 300, "2026-01-01T00:30:00Z"))
    assert value(m, "megatronjob_last_checkpoint_timestamp_seconds", **job) == stamp(
        "2026-01-01T00:30:00Z"
    )

    m.forget("team-a", "llama")
    for name in (
        "megatronjob_checkpoint_iteration",
        "megatronjob_last_checkpoint_timestamp_seconds",
        "megatronjob_progress_timestamp_seconds",
        "megatronjob_iteration",
    ):
        assert value(m, name, **job) is None


def test_unreadable_progress_time_sets_nothing() -> None:
    m = Metrics()
    m.observe_status("ns", "j", progress(5, 5, "yesterday"))
    assert value(m, "megatronjob_progress_timestamp_seconds", namespace="ns", name="j") is None
    assert value(m, "megatronjob_iteration", namespace="ns", name="j") == 5


def test_ready_gauge_starts_at_zero() -> None:
    m = Metrics()
    assert value(m, "megatron_operator_ready") == 0
    m.ready.set(1)
    assert value(m, "megatron_operator_ready") == 1
