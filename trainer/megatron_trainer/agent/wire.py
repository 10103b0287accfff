"""Messages between the launchers and the coordinator: one JSON object per line, over TCP.

Launcher → coordinator:
    {"op": "hello", "node": 3, "pod": "job-a0-3", "epoch": null}   epoch: attempt its ranks run
    {"op": "failed", "epoch": 4, "local": 1, "code": 137, "time": "…"}
    {"op": "stopped"}                                              no rank of it runs any more
    {"op": "started", "epoch": 5}
    {"op": "bye", "code": 0}                                       leaving on purpose
Coordinator → launcher:
    {"op": "stop", "attempt": 5}                 stop every rank of an older attempt
    {"op": "start", "attempt": 5, "port": 41234} start the ranks of attempt 5 (MASTER_PORT 41234)

A connection that sends anything else, or a line over MAX_LINE bytes, is closed: the port is as
reachable as the rendezvous store's, so what arrives is checked, never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

MAX_LINE = 4096
if TYPE_CHECKING:  # for annotations only (the launcher runs on Python 3.8 too)
    Message = dict[str, Any]


class ProtocolError(Exception):
    """The peer sent something that is not a message of this protocol."""


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class Conn:
    """One non-blocking connection: buffered writes, and reads split into messages."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.inbox = b""
        self.outbox = b""
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Message) -> None:
        self.outbox += encode(message)
        self.flush()

    def flush(self) -> None:
        """Write what the socket takes now; the rest waits for `wants_write`."""
        while self.outbox and not self.closed:
            try:
                sent = self.sock.send(self.outbox)
            except BlockingIOError:
                return
            except OSError:
                self.close()
                return
            self.outbox = self.outbox[sent:]

    @property
    def wants_write(self) -> bool:
        return bool(self.outbox) and not self.closed

    def receive(self) -> Iterator[Message]:
        """The messages that arrived; sets `closed` at end of stream. Raises ProtocolError."""
        while not self.closed:
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EINTR:
                    continue
                self.close()
                break
            if not chunk:
                self.close()
                break
            self.inbox += chunk
            if len(self.inbox) > 64 * MAX_LINE:
                raise ProtocolError("too much unread data")
        while b"\n" in self.inbox:
            line, self.inbox = self.inbox.split(b"\n", 1)
            yield decode(line)
        if len(self.inbox) > MAX_LINE:
            raise ProtocolError(f"a line longer than {MAX_LINE} bytes")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()


def decode(line: bytes) -> Message:
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line longer than {MAX_LINE} bytes")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as err:
        raise ProtocolError(f"not JSON: {err}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError("not a message")
    return message


def count(message: Message, key: str, upper: int = 2**31 - 1) -> int | None:
    """A non-negative int field, or None."""
    value = message.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= upper
    return value if ok else None
