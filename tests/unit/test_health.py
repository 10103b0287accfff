"""The operator's probes: /readyz follows the watches, /livez the heartbeats, /metrics the
registry; served by a real HTTP server on loopback."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from megatron_operator.cluster.health import STALE_SECONDS, Health, serve


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


@pytest.fixture
def served() -> Iterator[tuple[int, Health, Clock, CollectorRegistry]]:
    clock = Clock()
    health = Health(clock)
    registry = CollectorRegistry()
    server = serve(0, registry, health, host="127.0.0.1")
    try:
        yield server.server_address[1], health, clock, registry
    finally:
        server.shutdown()
        server.server_close()


def test_ready_only_when_the_runtime_says_so(
    served: tuple[int, Health, Clock, CollectorRegistry],
) -> None:
    port, health, _, _ = served
    assert _get(port, "/readyz") == (503, "starting\n")
    state = {"synced": False}
    health.readiness = lambda: (state["synced"], "ok" if state["synced"] else "waiting: nodes")
    assert _get(port, "/readyz") == (503, "waiting: nodes\n")
    state["synced"] = True
    assert _get(port, "/readyz") == (200, "ok\n")


def test_a_failing_readiness_check_answers_503(
    served: tuple[int, Health, Clock, CollectorRegistry],
) -> None:
    port, health, _, _ = served

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    health.readiness = broken
    code, body = _get(port, "/readyz")
    assert code == 503 and "boom" in body


def test_live_until_a_heartbeat_goes_stale(
    served: tuple[int, Health, Clock, CollectorRegistry],
) -> None:
    port, health, clock, _ = served
    health.expect("event-loop", "reconcile-pool")
    assert _get(port, "/livez")[0] == 200
    clock.now += STALE_SECONDS - 1
    health.beat("event-loop")
    assert _get(port, "/livez")[0] == 200
    clock.now += 2  # the pool has not reported for STALE_SECONDS + 1
    code, body = _get(port, "/livez")
    assert code == 503 and "reconcile-pool" in body and "event-loop" not in body
    health.beat("reconcile-pool")
    assert _get(port, "/livez")[0] == 200


def test_metrics_and_unknown_paths(served: tuple[int, Health, Clock, CollectorRegistry]) -> None:
    port, _, _, registry = served
    Counter("probe_test_total", "a test counter", registry=registry).inc(3)
    code, body = _get(port, "/metrics")
    assert code == 200 and "probe_test_total 3.0" in body
    assert _get(port, "/nope")[0] == 404
