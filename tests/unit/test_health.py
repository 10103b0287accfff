"""The operator's probes: /readyz follows the watches, /livez the heartbeats, /metrics the
registry; served by the real servers on loopback. Also: idle connections cannot starve the
probes or grow threads (cluster/httpserve.py)."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from megatron_operator.cluster import authn
from megatron_operator.cluster.authn import TokenAuthorizer
from megatron_operator.cluster.health import (
    STALE_SECONDS,
    Health,
    serve_health,
    serve_metrics,
    tls_context,
)
from megatron_operator.cluster.httpserve import Reply, Server


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


def _tls_context(tmp: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1."""
    from datetime import UTC, datetime, timedelta
    from ipaddress import ip_address

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "metrics")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - timedelta(minutes=1)).not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return tls_context(str(tmp))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_half_open_tls_handshakes_count_against_the_connection_cap(tmp_path: Path) -> None:
    """Connections are capped from the TCP accept on: 2,000 handshakes that never finished once
    held ~275 MB, since the cap counted only connections past their handshake."""
    cap = 16
    server = Server(
        "127.0.0.1", 0, lambda path, headers: Reply(200, b"ok\n"), tls=_tls_context(tmp_path),
        max_connections=cap,
    )  # fmt: skip
    idle: list[socket.socket] = []
    try:
        before = _open_fds()
        for _ in range(100):  # TCP connections that never send a ClientHello
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
        time.sleep(0.5)  # let the server accept them all
        # Ours are 100; the server keeps at most `cap` of its ends (it closed the oldest).
        assert _open_fds() - before <= 100 + cap + 4
        client = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        started = time.monotonic()
        with urllib.request.urlopen(
            f"https://127.0.0.1:{server.port}/x", timeout=5, context=client
        ) as r:
            assert r.read() == b"ok\n"
        assert time.monotonic() - started < 2.0
        assert server.evicted >= 100 - cap
    finally:
        for s in idle:
            s.close()
        server.close()


def test_only_jwts_are_reviewed_and_reviews_are_rate_limited() -> None:
    """A made-up token costs the apiserver nothing: only a JWT is sent for review, and reviews of
    tokens not in the cache are rate-limited (429 beyond)."""
    clock = Clock()
    authorizer = TokenAuthorizer(None, clock=clock)
    asked: list[str] = []

    def ask(token: str, path: str) -> str:
        asked.append(token)
        return "unauthenticated"

    authorizer._ask = ask  # type: ignore[method-assign]
    for bogus in ("not-a-token", "a.b", "x" * 5000, "abc.def.ghi jkl"):
        assert authorizer.decide(f"Bearer {bogus}", "/metrics") == "unauthenticated"
    assert asked == []
    jwts = [f"eyJh{i:04d}.eyJzdWIi{i:04d}.c2ln{i:04d}" for i in range(40)]
    decisions = [authorizer.decide(f"Bearer {t}", "/metrics") for t in jwts]
    assert len(asked) == authn.REVIEW_BURST and decisions.count("throttled") == 40 - len(asked)
    clock.now += 1.0  # the bucket refills at REVIEWS_PER_SECOND
    assert authorizer.decide(f"Bearer {jwts[-1]}", "/metrics") == "unauthenticated"
    assert authorizer.decide(f"Bearer {jwts[0]}", "/metrics") == "unauthenticated"  # cached
    assert len(asked) == authn.REVIEW_BURST + 1
