"""The operator's probes: /readyz follows the watches, /livez the heartbeats, /metrics the
registry; served by the real servers on loopback. Also: idle connections cannot starve the
probes or grow threads (cluster/httpserve.py)."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from megatron_operator.cluster.health import STALE_SECONDS, Health, serve_health, serve_metrics


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
    server = serve_health(0, health, host="127.0.0.1")
    try:
        yield server.port, health, clock, registry
    finally:
        server.close()


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
    assert _get(port, "/metrics")[0] == 404  # no job data on the unauthenticated probe port
    assert _get(port, "/nope")[0] == 404
    Counter("probe_test_total", "a test counter", registry=registry).inc(3)
    metrics = serve_metrics(0, registry, "127.0.0.1")
    try:
        code, body = _get(metrics.port, "/metrics")
        assert code == 200 and "probe_test_total 3.0" in body
        assert _get(metrics.port, "/readyz")[0] == 404
    finally:
        metrics.close()


class Denier:
    def decide(self, authorization: str | None, path: str) -> str:
        return "allowed" if authorization == "Bearer good" else "unauthenticated"


def test_metrics_need_an_allowed_token_when_an_authorizer_is_given() -> None:
    metrics = serve_metrics(0, CollectorRegistry(), "127.0.0.1", Denier())  # type: ignore[arg-type]
    try:
        assert _get(metrics.port, "/metrics")[0] == 401
        request = urllib.request.Request(
            f"http://127.0.0.1:{metrics.port}/metrics", headers={"Authorization": "Bearer good"}
        )
        with urllib.request.urlopen(request, timeout=5) as r:
            assert r.status == 200
    finally:
        metrics.close()


def test_idle_connections_neither_starve_the_probes_nor_grow_threads(
    served: tuple[int, Health, Clock, CollectorRegistry],
) -> None:
    """800 idle half-requests left 800 threads in ThreadingHTTPServer, never reaped."""
    port, health, _, _ = served
    health.readiness = lambda: (True, "ok")
    before = threading.active_count()
    idle = []
    try:
        for _ in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # never finished
            idle.append(s)
        started = time.monotonic()
        assert _get(port, "/readyz") == (200, "ok\n")
        assert time.monotonic() - started < 2.0
        assert threading.active_count() <= before + 4  # one loop thread and a small executor
    finally:
        for s in idle:
            s.close()
