"""Prometheus metrics of the operator (documented in docs/metrics.md)."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from megatron_operator.api.status import PHASES


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
            "Gang restarts, by failure reason",
            [*job, "reason"],
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

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def observe_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        phase = status.get("phase")
        for p in PHASES:
            self.phase.labels(namespace, name, p).set(1 if p == phase else 0)
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

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's series, so dashboards do not show ghosts."""
        for p in PHASES:
            self._remove(self.phase, namespace, name, p)
        for gauge in (self.iteration, self.tokens, self.mfu, self.loss):
            self._remove(gauge, namespace, name)

    @staticmethod
    def _remove(metric: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            metric.remove(*labels)
