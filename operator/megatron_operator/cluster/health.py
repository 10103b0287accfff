"""The operator's HTTP endpoint: Prometheus metrics, readiness and liveness.

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

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

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


def serve(
    port: int, registry: CollectorRegistry, health: Health, host: str = ""
) -> ThreadingHTTPServer:
    """Serve /metrics, /readyz and /livez on `port` from a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/readyz", "/livez", "/healthz"):
                ok, why = health.ready() if path == "/readyz" else health.live()
                self._reply(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found: try /metrics, /readyz or /livez\n", "text/plain")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would flood the log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
