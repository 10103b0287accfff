"""An exception of ours while reconciling (not the apiserver's refusal, not the job's own bad
data) never fails the job or touches its pods: the controller retries with a growing backoff,
counts it in a metric, logs the traceback once (not every retry) and posts one event. The same
on the real apiserver: tests/integration/test_operator_hostile.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from megatron_operator.cluster.controller import Controller
from megatron_operator.cluster.guard import TRACEBACK_EVERY_SECONDS, BugGuard
from megatron_operator.cluster.kube import Kube
from megatron_operator.cluster.metrics import Metrics
from megatron_operator.core.reconcile import Outcome, Settings, World

JOB = {
    "apiVersion": "megatron.dev/v1alpha1",
    "kind": "MegatronJob",
    "metadata": {"namespace": "team", "name": "job", "uid": "job-uid"},
    "spec": {},
    "status": {"phase": "Running"},
}


class Kube1:
    """Just enough of Kube for one reconcile to reach the state machine; records writes."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.submitted: list[Any] = []
        self.pool = SimpleNamespace(submit=lambda *a, **k: self.submitted.append(a))

    def get_job(self, ns: str, name: str) -> dict[str, Any]:
        return dict(JOB)

    def list_pods(self, ns: str, job: str, slim: bool = False) -> list[Any]:
        return []

    def get_lease(self, ns: str, name: str) -> None:
        return None

    def accepted_spec(self, ns: str, name: str) -> None:
        return None

    def list_job_defaults(self, ns: str) -> list[Any]:
        return []

    def replace_status(self, job: Any, status: Any) -> None:
        self.writes.append("status")

    def delete_pods(self, *a: Any, **k: Any) -> None:
        self.writes.append("delete")

    def create_pods(self, *a: Any, **k: Any) -> int:
        self.writes.append("create")
        return 0


def _buggy(world: World, settings: Settings) -> Outcome:
    raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")


def _count(metrics: Metrics, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "megatron_operator_reconcile_errors_total", {"exception": kind}
    )
    return value or 0.0


def test_a_bug_backs_off_counts_and_writes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    kube, metrics = Kube1(), Metrics()
    c = Controller(cast(Kube, kube), metrics, decide=_buggy)
    c.guard.draw = lambda: 0.0  # no jitter: the schedule is exact
    with caplog.at_level(logging.WARNING, logger="megatron_operator.cluster.guard"):
        delays = [c.reconcile_job("team", "job") for _ in range(6)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert kube.writes == []  # no status, no delete, no create
    assert _count(metrics, "TypeError") == 6
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "left as they are" in tracebacks[0].getMessage()
    assert len(kube.submitted) == 1  # one Warning event, not one per retry
    c.decide = lambda w, s: Outcome(status=dict(w.job.get("status") or {}))
    assert c.reconcile_job("team", "job") == Settings().resync_seconds
    assert ("team", "job") not in c.guard.jobs  # recovered: the next bug starts over


def test_the_backoff_is_capped_and_a_changed_error_is_logged_again() -> None:
    clock = [0.0]
    guard = BugGuard(Metrics(), clock=lambda: clock[0], draw=lambda: 0.0)
    key = ("team", "job")
    delays = [guard.failed(key, ValueError("x"))[0] for _ in range(20)]
    assert delays[-1] == 300.0 and delays == sorted(delays)
    assert guard.failed(key, KeyError("other"))[1] is True  # a new error: told once more
    assert guard.failed(key, KeyError("other"))[1] is False
    trouble = guard.jobs[key]
    clock[0] += TRACEBACK_EVERY_SECONDS
    guard.failed(key, KeyError("other"))
    assert guard.jobs[key].logged_at == clock[0] and trouble is guard.jobs[key]


def test_a_reconcile_finishing_while_the_operator_stops_posts_no_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At SIGTERM the pools shut down while a reconcile may still be running: its events are
    dropped quietly, not raised as an operator error (with a traceback) from the job's loop."""
    from concurrent.futures import ThreadPoolExecutor

    kube = Kube1()
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    kube.pool = pool  # type: ignore[assignment]
    c = Controller(cast(Kube, kube), Metrics(), decide=_buggy)
    c.guard.draw = lambda: 0.0
    with caplog.at_level(logging.INFO, logger="megatron_operator.cluster.controller"):
        c._event(dict(JOB), "Normal", "Started", "attempt 0")
        assert c.reconcile_job("team", "job") == 1.0  # the bug's ReconcileError event: dropped
    assert [r.getMessage() for r in caplog.records if "not posted" in r.getMessage()] == [
        "stopping: an event was not posted"
    ] * 2
