"""Messages between the launchers and the coordinator: one JSON object per line, over TCP.

Each side proves it holds the job's coordinator key (a Secret only the job's pods mount) before
anything else: the coordinator sends a nonce as soon as a connection opens, the launcher answers
with its hello, its own nonce and an HMAC-SHA256 over both nonces and the hello, and the
coordinator answers with an HMAC over both nonces the other way round. Anything before that is
refused; a connection that has not said a valid hello within HELLO_TIMEOUT_SECONDS is closed.

Coordinator → launcher, first:
    {"op": "challenge", "nonce": "<64 hex>"}
Launcher → coordinator:
    {"op": "hello", "node": 3, "pod": "job-a0-3", "epoch": null,   epoch: attempt its ranks run
     "nonce": "<64 hex>", "mac": "<64 hex>"}
    {"op": "failed", "epoch": 4, "local": 1, "code": 137, "time": "…"}
    {"op": "stopped"}                                              no rank of it runs any more
    {"op": "started", "epoch": 5}
    {"op": "bye", "code": 0}                                       leaving on purpose
Coordinator → launcher:
    {"op": "welcome", "mac": "<64 hex>"}         the coordinator holds the key too
    {"op": "stop", "attempt": 5}                 stop every rank of an older attempt (also to
                                                 a launcher whose rank failed: attempt 5 is
                                                 decided, wait for its start)
    {"op": "start", "attempt": 5, "port": 41234} start the ranks of attempt 5 (MASTER_PORT 41234)

With spare nodes (liveness.py), the hello also says "spare": its number (a spare pod; its "node"
is then NNODES + that number) or null, "ip": the pod's IP, "standby": the port where it would
coordinate were the coordinator lost, and "term": the newest coordinator term it joined; the
welcome says the coordinator's "term" and "pod" (under its MAC). Then:
    {"op": "ping", "seq": 7}                                 launcher, every HEARTBEAT_SECONDS
    {"op": "pong", "seq": 7, "ok": true}                     every ping; ok: the lease granted
    {"op": "roster", "term": 1, "candidates": [[pod, host, port], ...]}   who coordinates next
    {"op": "start", ..., "node": 1, "master": "10.0.0.7"}    the node rank it runs, and the
                                                             rendezvous host (node rank 0's)
    {"op": "stop", "attempt": 5, "leave": true}              its rank moved on: stop, and exit

A connection that sends anything else, or a line over MAX_LINE bytes, is closed: the port is as
reachable as the rendezvous store's, so what arrives is checked, never trusted. The key proves
membership; it does not encrypt: a peer that can read and write the pod network's packets in
between (not another pod) could still take over an open connection.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import secrets
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

MAX_LINE = 4096
if TYPE_CHECKING:  # for annotations only (the launcher runs on Python 3.8 too)
    Message = dict[str, Any]
# Until a valid hello, a connection may not stay longer than this, and no more than MAX_PENDING
# of them are kept (the oldest goes first): idle connections cannot crowd out the launchers.
HELLO_TIMEOUT_SECONDS = 5.0
MAX_PENDING = 32
MIN_KEY_BYTES = 16
NONCE_BYTES = 32


def read_key(path: str) -> bytes:
    """The job's coordinator key. Raises OSError or ValueError (too short to be a key)."""
    with open(path, "rb") as f:
        key = f.read(4096)
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{path} holds {len(key)} bytes: not a key")
    return key


def nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def is_nonce(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == 2 * NONCE_BYTES
        and all(c in "0123456789abcdef" for c in value)
    )


def mac(key: bytes, *parts: object) -> str:
    """HMAC-SHA256 of the parts, each as its JSON, one per line (no part can run into the next)."""
    text = "\n".join(json.dumps(p, separators=(",", ":")) for p in parts)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


HELLO_FIELDS = ("node", "pod", "epoch")
SPARE_HELLO_FIELDS = ("spare", "ip", "standby", "term")  # with spare nodes


def hello_mac(key: bytes, challenge: str, message: Message) -> str:
    """The launcher's proof: both nonces and what its hello claims."""
    fields = [message.get(k) for k in HELLO_FIELDS]
    if any(k in message for k in SPARE_HELLO_FIELDS):
        fields += [message.get(k) for k in SPARE_HELLO_FIELDS]
    return mac(key, "hello", challenge, message.get("nonce"), *fields)


def welcome_mac(
    key: bytes, challenge: str, launcher_nonce: str, term: int | None = None, pod: object = None
) -> str:
    """The coordinator's proof: the same nonces, another label (never equal to a hello's); with
    spare nodes, its term and pod too."""
    if term is None:
        return mac(key, "welcome", launcher_nonce, challenge)
    return mac(key, "welcome", launcher_nonce, challenge, term, pod)


def same(a: object, b: str) -> bool:
    return isinstance(a, str) and hmac.compare_digest(a.encode(), b.encode())


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
