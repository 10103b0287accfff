"""Prometheus metrics of the operator (documented in docs/metrics.md)."""

from __future__ import annotations

import contextlib
import typing
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from megatron_operator.api.spec import FailureReason
from megatron_operator.api.status import PHASES, Cause, Rung
from megatron_operator.core.observe import parse_time

# Every reason a restart can have: each job's counter starts at 0 for each, so `increase()` sees
# the very first restart (a series born at 1 has no earlier sample to increase from).
RESTART_REASONS: tuple[str, ...] = typing.get_args(FailureReason)
# Every (reason, rung) series of a job, created at 0 when the job is first seen: increase() over
# a series that appears at 1 misses that first restart.
RESTART_SERIES: tuple[tuple[str, str], ...] = tuple(
    (reason, rung) for reason in RESTART_REASONS for rung in (r.value for r in Rung)
)
DEFAULT_HANG_TIMEOUT_SECONDS = 1800  # spec.restartPolicy.hangTimeoutSeconds's default


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        job = ["namespace", "name"]
        self.phase = Gauge(
            "megatronjob_phase",
            "1 for the job's current phase, 0 for the others",
            [*job, "phase"],
            registry=r,
        )
        self.restarts = Counter(
            "megatronjob_restarts_total",
            "Restarts, by failure reason and by rung (InPlace, ReplacePod, Recreate)",
            [*job, "reason", "rung"],
            registry=r,
        )
        self.time_to_running = Histogram(
            "megatronjob_time_to_running_seconds",
            "From the job's creation to all pods of its first attempt Running",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
            registry=r,
        )
        self.reconcile = Histogram(
            "megatronjob_reconcile_duration_seconds",
            "One reconcile of one job: observe, decide, write status, act",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.iteration = Gauge(
            "megatronjob_iteration", "Last reported training step", job, registry=r
        )
        self.tokens = Gauge(
            "megatronjob_tokens_per_second", "Last reported training throughput", job, registry=r
        )
        self.mfu = Gauge(
            "megatronjob_mfu", "Last reported model FLOPs utilisation (0-1)", job, registry=r
        )
        self.loss = Gauge("megatronjob_loss", "Last reported training loss", job, registry=r)
        self.checkpoint_iteration = Gauge(
            "megatronjob_checkpoint_iteration",
            "Step of the newest complete checkpoint rank 0 reported",
            job,
            registry=r,
        )
        self.checkpoint_time = Gauge(
            "megatronjob_last_checkpoint_timestamp_seconds",
            "Unix time of the first progress report that carried the newest checkpoint step",
            job,
            registry=r,
        )
        self.progress_time = Gauge(
            "megatronjob_progress_timestamp_seconds",
            "Unix time of rank 0's last progress report",
            job,
            registry=r,
        )
        self.running_since = Gauge(
            "megatronjob_running_since_timestamp_seconds",
            "Unix time the current attempt became Running (absent while not Running)",
            job,
            registry=r,
        )
        self.hang_timeout = Gauge(
            "megatronjob_hang_timeout_seconds",
            "The job's restartPolicy.hangTimeoutSeconds (0: off)",
            job,
            registry=r,
        )
        self.goodput_seconds = Counter(
            "megatronjob_goodput_seconds",
            "The job's wall time by cause (status.ledger; docs/metrics.md defines each cause), "
            "as the ledger attributes it",
            [*job, "cause"],
            registry=r,
        )
        self.goodput = Gauge(
            "megatronjob_goodput_ratio",
            "Productive seconds over wall seconds since the job was created (status.ledger)",
            job,
            registry=r,
        )
        self.gpus = Gauge(
            "megatronjob_gpus",
            "GPUs the job's pods request (status.gpus; 0 on CPU), to weigh a fleet's goodput",
            job,
            registry=r,
        )
        self.remaining = Gauge(
            "megatronjob_forecast_remaining_seconds",
            "Expected seconds to the job's last step, counting failures (status.forecast); "
            "quantile 0.5 is the expectation, 0.9 the 90th percentile",
            [*job, "quantile"],
            registry=r,
        )
        self.ready = Gauge(
            "megatron_operator_ready",
            "1 once this replica is ready (what /readyz reports): its watches synced, or a "
            "healthy standby",
            registry=r,
        )
        self.leader = Gauge(
            "megatron_operator_leader",
            "1 on the replica that reconciles (the leader, or the only one), 0 on a standby",
            registry=r,
        )
        self.api_errors = Counter(
            "megatron_operator_api_errors_total",
            "Failed apiserver calls made while reconciling, by kind (Forbidden, Throttled, ...)",
            ["kind"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "megatron_operator_reconcile_errors_total",
            "Reconciles that raised an operator error (a bug, not the apiserver's refusal), by "
            "exception type: the job is retried with a backoff, its pods untouched",
            ["exception"],
            registry=r,
        )
        self.events_dropped = Counter(
            "megatron_operator_events_dropped_total",
            "Events not posted because their job exceeded its rate (a burst of 25, then one "
            "per 5 minutes; repeats of one event only update its count)",
            registry=r,
        )
        # The checkpoint step each job's checkpoint_time belongs to (the gauge has no history).
        self._checkpoints: dict[tuple[str, str], int] = {}
        self._seen: set[tuple[str, str]] = set()  # jobs whose counters exist (at 0 or more)
        # Per job, the ledger seconds each cause's counter holds (a counter only goes up).
        self._ledgers: dict[tuple[str, str], dict[str, float]] = {}

    def observe_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        spec: dict[str, Any] | None = None,
    ) -> None:
        if (namespace, name) not in self._seen:
            self._seen.add((namespace, name))
            for reason, rung in RESTART_SERIES:
                self.restarts.labels(namespace, name, reason, rung)  # the series, at 0
        if isinstance(spec, dict):
            self.hang_timeout.labels(namespace, name).set(_hang_timeout(spec))
        running = (
            parse_time(status.get("runningSince")) if status.get("phase") == "Running" else None
        )
        if running is not None and not _no_progress_source(spec):
            # Without it MegatronJobNoProgress has nothing to measure from: a job that declared
            # no progress source (trainer.progress None) is never judged idle.
            self.running_since.labels(namespace, name).set(running.timestamp())
        else:
            self._remove(self.running_since, namespace, name)
        phase = status.get("phase")
        for p in PHASES:
            self.phase.labels(namespace, name, p).set(1 if p == phase else 0)
        gpus = status.get("gpus")
        if isinstance(gpus, int) and not isinstance(gpus, bool):
            self.gpus.labels(namespace, name).set(gpus)
        self._observe_ledger(namespace, name, status.get("ledger"), status.get("forecast"))
        progress = status.get("progress")
        if isinstance(progress, dict):
            for gauge, key in (
                (self.iteration, "iteration"),
                (self.tokens, "tokensPerSecond"),
                (self.mfu, "mfu"),
                (self.loss, "loss"),
            ):
                value = progress.get(key)
                if isinstance(value, (int, float)):
                    gauge.labels(namespace, name).set(value)
            self._observe_times(namespace, name, progress)

    def _observe_times(self, namespace: str, name: str, progress: dict[str, Any]) -> None:
        """Report and checkpoint times from status.progress. A checkpoint's time is that of the
        first report that carried its step: exact when the trainer reports right after saving,
        and at worst one report late (after an operator restart, the first report it reads)."""
        when = parse_time(progress.get("time"))
        if when is None:
            return
        stamp = when.timestamp()
        self.progress_time.labels(namespace, name).set(stamp)
        step = progress.get("checkpointIteration")
        if not isinstance(step, int) or isinstance(step, bool):
            return
        key = (namespace, name)
        if self._checkpoints.get(key) != step:
            self._checkpoints[key] = step
            self.checkpoint_iteration.labels(namespace, name).set(step)
            self.checkpoint_time.labels(namespace, name).set(stamp)

    def _observe_ledger(self, namespace: str, name: str, ledger: object, forecast: object) -> None:
        """The ledger's seconds by cause into counters: each advances by what the ledger added
        since the last look. Only attributed seconds count: the open interval the status shows
        as `unattributed` joins a cause once a fact says which (a counter cannot give back)."""
        if not isinstance(ledger, dict) or not isinstance(ledger.get("seconds"), dict):
            return
        seconds: dict[str, float] = {}
        for key, raw in ledger["seconds"].items():
            value = _number(raw)
            if value is not None:
                seconds[str(key)] = value
        fold = ledger.get("fold")
        closed = _number(fold.get("closed")) if isinstance(fold, dict) else None
        wall = _number(ledger.get("wallSeconds"))
        if closed is not None and wall is not None:
            unattributed = seconds.get(Cause.UNATTRIBUTED, 0.0) - max(wall - closed, 0.0)
            seconds[Cause.UNATTRIBUTED] = max(unattributed, 0.0)
        counted = self._ledgers.setdefault((namespace, name), {})
        for cause in Cause:
            value, before = seconds.get(cause, 0.0), counted.get(cause, 0.0)
            if value > before:
                self.goodput_seconds.labels(namespace, name, str(cause)).inc(value - before)
                counted[cause] = value
        goodput = _number(ledger.get("goodput"))
        if goodput is not None:
            self.goodput.labels(namespace, name).set(goodput)
        for quantile, field in (("0.5", "remainingSeconds"), ("0.9", "p90Seconds")):
            value = _number(forecast.get(field)) if isinstance(forecast, dict) else None
            if value is not None:
                self.remaining.labels(namespace, name, quantile).set(value)
            else:
                self._remove(self.remaining, namespace, name, quantile)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's series, so dashboards do not show ghosts."""
        for p in PHASES:
            self._remove(self.phase, namespace, name, p)
        for gauge in (
            self.iteration,
            self.tokens,
            self.mfu,
            self.loss,
            self.checkpoint_iteration,
            self.checkpoint_time,
            self.progress_time,
            self.running_since,
            self.hang_timeout,
            self.goodput,
            self.gpus,
        ):
            self._remove(gauge, namespace, name)
        for quantile in ("0.5", "0.9"):
            self._remove(self.remaining, namespace, name, quantile)
        for cause in self._ledgers.pop((namespace, name), {}):
            self._remove(self.goodput_seconds, namespace, name, cause)
        for reason, rung in RESTART_SERIES:
            self._remove(self.restarts, namespace, name, reason, rung)
        self._checkpoints.pop((namespace, name), None)
        self._seen.discard((namespace, name))

    @staticmethod
    def _remove(metric: Gauge | Counter, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)


def _no_progress_source(spec: dict[str, Any] | None) -> bool:
    trainer = spec.get("trainer") if isinstance(spec, dict) else None
    return isinstance(trainer, dict) and trainer.get("progress") == "None"


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None  # type: ignore[arg-type]


def _hang_timeout(spec: dict[str, Any]) -> int:
    policy = spec.get("restartPolicy")
    hang = policy.get("hangTimeoutSeconds") if isinstance(policy, dict) else None
    if isinstance(hang, int) and not isinstance(hang, bool) and hang >= 0:
        return hang
    return DEFAULT_HANG_TIMEOUT_SECONDS
