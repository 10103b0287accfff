"""The operator's HTTP endpoints: readiness and liveness on the health port, Prometheus metrics
on the metrics port (authenticated off loopback, see cluster/authn.py). Both are served by
cluster/httpserve.py: one thread, a connection cap and read timeouts.

- `/readyz` is 200 once the operator can act on what it sees: it leads (or stands by, see
  below) and its pod and node watches have listed everything. Before that, a restarted operator
  knows nothing about the nodes, and a rolling upgrade must not count it as available.
  A standby replica (leader election) is ready too: it is healthy and waiting, and a rollout that
  waited for it to lead would never finish.
- `/livez` is 200 while the reconcile machinery turns: the asyncio loop and the reconcile thread
  pool each report a heartbeat, and a heartbeat older than `STALE_SECONDS` means a wedged loop,
  which only a restart cures. A TCP check would pass for a process whose loops are all stuck.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from megatron_operator.cluster.authn import Decision, TokenAuthorizer
from megatron_operator.cluster.httpserve import Reply, Server

STALE_SECONDS = 120.0


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.beats: dict[str, float] = {}
        # (ready, why): replaced by the runtime once it knows how to judge readiness.
        self.readiness: Callable[[], tuple[bool, str]] = lambda: (False, "starting")

    def expect(self, *names: str) -> None:
        """Register heartbeats that must keep coming (counted from now)."""
        with self.lock:
            for name in names:
                self.beats.setdefault(name, self.clock())

    def beat(self, name: str) -> None:
        with self.lock:
            self.beats[name] = self.clock()

    def live(self) -> tuple[bool, str]:
        now = self.clock()
        with self.lock:
            stale = sorted(n for n, t in self.beats.items() if now - t > STALE_SECONDS)
        if stale:
            return False, f"no heartbeat for {STALE_SECONDS:g}s from: {', '.join(stale)}"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        try:
            return self.readiness()
        except Exception as exc:  # a probe must answer, whatever the runtime's state
            return False, f"readiness check failed: {exc}"


def serve_health(port: int, health: Health, host: str = "") -> Server:
    """Serve /readyz and /livez (and /healthz, an alias of /livez) on `port`. They say only
    whether the operator is ready and alive: no job data, so no authentication (the kubelet
    probes them)."""

    def handle(path: str, headers: Mapping[str, str]) -> Reply:
        if path in ("/readyz", "/livez", "/healthz"):
            ok, why = health.ready() if path == "/readyz" else health.live()
            return Reply(200 if ok else 503, f"{why}\n".encode())
        return Reply(404, b"not found: try /readyz or /livez\n")

    return Server(host, port, handle, name="health")


def serve_metrics(
    port: int,
    registry: CollectorRegistry,
    host: str = "127.0.0.1",
    authorizer: TokenAuthorizer | None = None,
    tls: ssl.SSLContext | None = None,
) -> Server:
    """Serve /metrics on `port`. Every tenant's job names, loss and throughput are in it, so
    off loopback it needs `authorizer`: the caller's bearer token must be allowed to `get` the
    non-resource URL /metrics (cluster/authn.py), as controller-runtime's secure serving."""

    def handle(path: str, headers: Mapping[str, str]) -> Reply:
        if path != "/metrics":
            return Reply(404, b"not found: try /metrics\n")
        if authorizer is not None:
            try:
                decision = authorizer.decide(headers.get("authorization"), path)
            except Exception as exc:  # the apiserver did not answer: say so, keep serving
                return Reply(503, f"cannot check the bearer token now: {exc}\n".encode())
            if decision == Decision.UNAUTHENTICATED:
                return Reply(401, b"a bearer token the apiserver accepts is required\n")
            if decision == Decision.THROTTLED:
                return Reply(429, b"too many unknown tokens to check: try again shortly\n")
            if decision != Decision.ALLOWED:
                return Reply(403, b"this identity may not get /metrics\n")
        return Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)

    return Server(host, port, handle, name="metrics", tls=tls)


def tls_context(cert_dir: str) -> ssl.SSLContext:
    """A server context from `cert_dir`/tls.crt and tls.key (a Secret of type kubernetes.io/tls)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(f"{cert_dir}/tls.crt", f"{cert_dir}/tls.key")
    return context
