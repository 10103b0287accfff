"""A small HTTP/1.1 server for the probes and the metrics, hardened for a shared cluster.

Any pod can open connections to the operator's ports. `ThreadingHTTPServer` gave each one a
thread with no read timeout: 800 idle half-requests left 800 threads, never reaped. This server
runs on one asyncio loop in one thread, whatever the number of connections:

- at most `max_connections` at once, counted from the TCP accept, before any TLS handshake
  (2,000 half-open handshakes once held ~275 MB): a new connection over the cap closes the
  oldest one still in its handshake or waiting for its request (an idle connection cannot keep
  a probe out; a request arrives within milliseconds of its connection, so a real client is not
  the oldest);
- TLS is started on the accepted connection, within `read_timeout`;
- a request must arrive whole (request line and headers, at most `MAX_HEADER_BYTES`) within
  `read_timeout` seconds, or the connection is closed; one request per connection;
- only GET and HEAD; a handler runs in a small executor (rendering 2,000 jobs' metrics takes a
  moment), with a deadline of its own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 8192
READ_TIMEOUT = 5.0
HANDLER_TIMEOUT = 30.0
MAX_CONNECTIONS = 128


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# (path, headers with lower-case names) → reply. Runs in the server's executor.
Handler = Callable[[str, Mapping[str, str]], Reply]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Server:
    """Serves `handler` on host:port from a daemon thread; `port` 0 picks a free one."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        name: str = "http",
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT,
        workers: int = 2,
    ) -> None:
        self.handler = handler
        self.tls = tls
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.open = 0  # connections now open (the loop's thread only)
        self.evicted = 0  # idle connections closed to make room
        # Connections still reading their request, oldest first (insertion order).
        self.reading: dict[asyncio.StreamWriter, None] = {}
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            try:
                self.server = self.loop.run_until_complete(
                    asyncio.start_server(
                        self._connection, host or None, port, limit=MAX_HEADER_BYTES
                    )
                )
            except BaseException as exc:  # e.g. the port is taken: the caller raises it
                failure.append(exc)
                started.set()
                return
            started.set()
            try:
                self.loop.run_forever()
            finally:
                self._wind_down()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()
        started.wait()
        if failure:
            raise failure[0]

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _wind_down(self) -> None:
        """On the server's thread, once its loop stopped: close the listener and every
        connection, then the loop itself."""
        if self.server is not None:
            self.server.close()
        for writer in list(self.reading):
            writer.transport.abort()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        if self.server is not None:
            self.loop.run_until_complete(self.server.wait_closed())
        self.loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections:
            oldest = next(iter(self.reading), None)
            if oldest is None:  # every slot is writing a reply: this one must wait its turn
                writer.transport.abort()
                return
            del self.reading[oldest]
            oldest.transport.abort()
            self.evicted += 1
        self.open += 1
        try:
            await self._serve_one(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # a slow, broken or hostile client: its connection just goes
        except Exception:
            log.exception("the HTTP server failed on a request")
        finally:
            self.open -= 1
            self.reading.pop(writer, None)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = writer
        self.reading[accepted] = None  # counted, and evictable, from the accept on
        if self.tls is not None:
            # (Not StreamWriter.start_tls: in 3.11 it fails with AttributeError on a connection
            # closed during the handshake, which is what an eviction does.)
            raw = writer.transport
            tls = await self.loop.start_tls(
                raw,
                raw.get_protocol(),
                self.tls,
                server_side=True,
                ssl_handshake_timeout=self.read_timeout,
            )
            if tls is None:
                raise ConnectionError("closed during the TLS handshake")
            secure = asyncio.StreamWriter(tls, tls.get_protocol(), reader, self.loop)
            try:
                await self._serve_request(reader, secure, accepted)
            finally:
                secure.close()  # its own object: unclosed, it warns when collected
            return
        await self._serve_request(reader, writer, accepted)

    async def _serve_request(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        accepted: asyncio.StreamWriter,
    ) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
        except asyncio.LimitOverrunError:
            self.reading.pop(accepted, None)
            await self._reply(writer, Reply(400, b"request headers too large\n"))  # over TLS too
            return
        self.reading.pop(accepted, None)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            await self._reply(writer, Reply(400, b"bad request line\n"))
            return
        method, target, _ = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            await self._reply(writer, Reply(405, b"only GET\n"))
            return
        path = target.split("?", 1)[0]
        reply = await asyncio.wait_for(
            self.loop.run_in_executor(self.executor, self.handler, path, headers),
            HANDLER_TIMEOUT,
        )
        await self._reply(writer, reply, head_only=method == "HEAD")

    async def _reply(
        self, writer: asyncio.StreamWriter, reply: Reply, head_only: bool = False
    ) -> None:
        reason = _REASONS.get(reply.status, "Status")
        head = (
            f"HTTP/1.1 {reply.status} {reason}\r\n"
            f"Content-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode("latin-1")
        writer.write(head if head_only else head + reply.body)
        await asyncio.wait_for(writer.drain(), self.read_timeout)
