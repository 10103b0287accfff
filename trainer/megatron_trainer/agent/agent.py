"""The in-place supervision loop of a launcher (`restartPolicy.strategy: InPlace`).

The launcher keeps its pod through a failed rank: it stops the pod's other ranks at once (they
would block in a collective), reports the failure to the coordinator, and waits for the
operator's decision, which the coordinator relays: stop the ranks of an older attempt, then
start the next attempt's ranks on a fresh rendezvous port. Nothing here decides a restart.

When the coordinator is gone it falls back to what a plain launcher does: healthy ranks keep
running, and a failed rank makes the launcher exit with the rank's code (or COORDINATOR_LOST
when it can tell nothing better), so the pod fails and the kubelet tells the operator.

One thread, one `selectors` loop over the coordinator's connection and a wake-up fd (signals in
a real launcher; a pipe for stand-in ranks in benchmarks).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from megatron_contract.exitcodes import ExitCode
from megatron_contract.ladder import DECISION_TIMEOUT_SECONDS

from .coordinator import now_text
from .ranks import Ranks
from .wire import (
    Conn,
    ProtocolError,
    count,
    hello_mac,
    is_nonce,
    nonce,
    same,
    welcome_mac,
)

if TYPE_CHECKING:
    from .wire import Message

log = logging.getLogger(__name__)

RECONNECT_GRACE_SECONDS = 10.0  # without the coordinator this long, a failed rank ends the pod
CONNECT_TIMEOUT_SECONDS = 1.0
# After SIGTERM, ranks normally exit together once their checkpoint is written. If some rank
# finished (143) and another has not after this long, it is stuck: kill it.
STRAGGLER_SECONDS = 120.0


class Agent:
    def __init__(
        self,
        *,
        node: int,
        pod: str,
        nproc: int,
        address: tuple[str, int],
        ranks: Ranks,
        key: bytes,
        wake_fd: int | None = None,
        on_wake: Callable[[], None] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.node, self.pod, self.nproc = node, pod, nproc
        self.address = address
        self.ranks = ranks
        self.key = key
        # The handshake of the current connection (wire.py): the coordinator's challenge, our
        # nonce, and whether the coordinator proved it holds the key.
        self.challenge: str | None = None
        self.own_nonce = ""
        self.welcomed = False
        self.held: list[Message] = []  # sent before the hello could be: they follow it
        self.wake_fd = wake_fd
        self.on_wake = on_wake
        self.say = say or (lambda text: log.warning("%s", text))
        self.conn: Conn | None = None
        self.connected_once = False
        self.next_connect = 0.0
        self.connect_failures = 0
        self.lost_since: float | None = None  # the coordinator went away (after a connect)
        self.epoch: int | None = None  # the attempt the ranks run
        self.succeeded: set[int] = set()
        self.failure: tuple[int, float] | None = None  # (exit code, when) awaiting a decision
        self.in_place = True
        self.terminating = False
        self.stopped_by_signal: int | None = None
        self.selector = selectors.DefaultSelector()
        if wake_fd is not None:
            self.selector.register(wake_fd, selectors.EVENT_READ, "wake")

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """SIGTERM or SIGINT reached the launcher (signal handler: only set flags)."""
        self.terminating = True
        self.stopped_by_signal = signum

    # --- the loop
    def run(self) -> int:
        code = self._loop()
        # Leaving on purpose (done, stopped, or giving up): not a launcher lost to the gang.
        if self.challenge is not None:
            self._send({"op": "bye", "code": code})
        if self.conn is not None:
            self.conn.flush()
        return code

    def _loop(self) -> int:
        while True:
            if self.terminating:
                return self._terminate()
            now = time.monotonic()
            if self.conn is None and now >= self.next_connect:
                self._connect()
            for key, _ in self.selector.select(self._timeout(now)):
                if key.data == "wake":
                    self._drain_wake()
                elif self.conn is not None:
                    self._read()
            if self.conn is not None and self.conn.wants_write:
                self.conn.flush()
                if self.conn.closed:
                    self._disconnected()
            if self.terminating:
                continue
            code = self._reap()
            if code is not None:
                return code
            code = self._deadlines(time.monotonic())
            if code is not None:
                return code

    def _timeout(self, now: float) -> float:
        waits = [0.5 if self.conn is None or not self.conn.wants_write else 0.01]
        if self.conn is None:
            waits.append(max(self.next_connect - now, 0.0))
        return min(waits)

    def _drain_wake(self) -> None:
        assert self.wake_fd is not None
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        if self.on_wake is not None:
            self.on_wake()

    # --- the coordinator
    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as err:
            self.connect_failures += 1
            delay = min(0.05 * 2 ** min(self.connect_failures, 5), 1.0)
            self.next_connect = time.monotonic() + delay
            if self.connect_failures in (20, 100) or self.connect_failures % 600 == 0:
                self.say(
                    f"cannot reach the coordinator at {self.address[0]}:{self.address[1]}: {err}"
                )
            return
        # The coordinator's pod is never replaced within a gang (losing it recreates the gang):
        # its address, once resolved, holds, and reconnecting needs no DNS.
        self.address = (str(sock.getpeername()[0]), self.address[1])
        self.conn = Conn(sock)
        self.selector.register(self.conn, selectors.EVENT_READ, "coordinator")
        self.challenge, self.welcomed, self.held = None, False, []  # hello after the challenge

    def _hello(self, m: Message) -> None:
        challenge = m.get("nonce")
        if self.challenge is not None or not is_nonce(challenge):
            raise ProtocolError("a bad challenge")
        assert isinstance(challenge, str)
        self.challenge, self.own_nonce = challenge, nonce()
        hello: Message = {
            "op": "hello",
            "node": self.node,
            "pod": self.pod,
            "epoch": self.epoch,
            "nonce": self.own_nonce,
        }
        hello["mac"] = hello_mac(self.key, challenge, hello)
        self._send(hello)
        held, self.held = self.held, []
        for message in held:
            self._send(message)

    def _welcome(self, m: Message) -> None:
        if self.challenge is None or self.welcomed:
            raise ProtocolError("an unexpected welcome")
        if not same(m.get("mac"), welcome_mac(self.key, self.challenge, self.own_nonce)):
            raise ProtocolError("a welcome without the job's key: not our coordinator")
        self.welcomed = True
        self.connect_failures = 0
        self.connected_once = True
        self.lost_since = None

    def _send(self, message: Message) -> None:
        """Queue a message; what the socket does not take now is flushed by the loop. Until
        the hello is out (it answers the challenge), messages wait behind it."""
        if self.conn is None:
            return
        if self.challenge is None and message.get("op") != "hello":
            self.held.append(message)
            return
        self.conn.send(message)
        if self.conn.closed:
            self._disconnected()

    def _read(self) -> None:
        assert self.conn is not None
        try:
            for message in self.conn.receive():
                self._handle(message)
        except ProtocolError as err:
            self.say(f"the coordinator sent {err}; reconnecting")
            self.conn.close()
        if self.conn is not None and self.conn.closed:
            self._disconnected()

    def _disconnected(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(self.conn)
            self.conn.close()
        self.conn = None
        if not self.welcomed:
            # Refused before the handshake ended (our node rank still held by our own dropped
            # connection, or not our coordinator): back off as after a failed connect.
            self.connect_failures += 1
            self.next_connect = time.monotonic() + min(
                0.05 * 2 ** min(self.connect_failures, 5), 1.0
            )
            if self.connect_failures in (20, 100) or self.connect_failures % 600 == 0:
                self.say("the coordinator keeps refusing this launcher; retrying")
            return
        self.welcomed = False
        self.lost_since = time.monotonic()
        self.next_connect = time.monotonic() + 0.05
        self.say("lost the connection to the coordinator; reconnecting")

    def _handle(self, m: Message) -> None:
        op = m.get("op")
        if op == "challenge":
            self._hello(m)
            return
        if op == "welcome":
            self._welcome(m)
            return
        if not self.welcomed:
            raise ProtocolError(f"{op!r} before the handshake")
        attempt = count(m, "attempt")
        if attempt is None:
            raise ProtocolError(f"no attempt in {m!r}")
        if op == "stop":
            if self.epoch is not None and self.epoch < attempt:
                self.ranks.kill()
                self.say(f"stopped the ranks of attempt {self.epoch} (attempt {attempt} decided)")
                self.epoch = None
            self.failure = None  # a decision came
            self._send({"op": "stopped"})
        elif op == "start":
            port = count(m, "port", 65535)
            if port is None:
                raise ProtocolError(f"no port in {m!r}")
            # The coordinator cannot hear the operator (no apiserver, no status file): a failed
            # rank then ends the pod at once, as a plain launcher's would.
            self.in_place = m.get("inPlace", True) is not False
            if self.ranks.running:
                self.ranks.kill()
            self.ranks.start(attempt, port)
            warm = getattr(self.ranks, "warm", 0)
            self.say(
                f"started the ranks of attempt {attempt} (rendezvous port {port}"
                + (f"; {warm} of {self.nproc} forked by the pod's zygote)" if warm else ")")
            )
            self.epoch = attempt
            self.succeeded.clear()
            self.failure = None
            self._send({"op": "started", "epoch": attempt})
        else:
            raise ProtocolError(f"unknown op {op!r}")

    # --- the ranks
    def _reap(self) -> int | None:
        """Handle ranks that ended; an exit code when the launcher must end."""
        for local, code in self.ranks.reap():
            if self.epoch is None:
                continue  # a late rank of a stopped attempt
            if code == ExitCode.OK:
                self.succeeded.add(local)
                if len(self.succeeded) == self.nproc and not self.ranks.running:
                    self.say(f"every rank of attempt {self.epoch} finished")
                    return int(ExitCode.OK)
                continue
            exited = now_text()  # when it was reaped: before the others are stopped (seconds)
            then = "waiting for the operator's decision" if self.in_place else "ending the pod"
            self.say(
                f"local rank {local} of attempt {self.epoch} exited with {code}; stopping the "
                f"others and {then}"
            )
            epoch = self.epoch
            self.ranks.kill()
            self.epoch = None
            if not self.in_place:
                return code
            self.failure = (code, time.monotonic())
            self._send(
                {"op": "failed", "epoch": epoch, "local": local, "code": code, "time": exited}
            )
            self._send({"op": "stopped"})
        return None

    def _deadlines(self, now: float) -> int | None:
        gone = self.lost_since if self.conn is None else None
        if self.failure is None:
            idle = self.epoch is None and self.connected_once
            if gone is not None and idle and now - gone > RECONNECT_GRACE_SECONDS:
                self.say("the coordinator is gone and no rank runs: ending the pod")
                return int(ExitCode.COORDINATOR_LOST)
            return None
        code, since = self.failure
        if gone is not None and now - max(gone, since) > RECONNECT_GRACE_SECONDS:
            self.say(f"cannot report the failed rank to the coordinator: exiting with {code}")
            return code
        if now - since > DECISION_TIMEOUT_SECONDS:
            self.say(
                f"no decision {DECISION_TIMEOUT_SECONDS:.0f}s after the failed rank: exiting "
                f"with {code} so that the pod fails"
            )
            return code
        return None

    def _terminate(self) -> int:
        """Forward the stop to the ranks (they checkpoint), wait for them, return the code."""
        name = signal.Signals(self.stopped_by_signal or signal.SIGTERM).name
        if not self.ranks.running:
            return int(ExitCode.SIGTERM)
        self.say(f"received {name}: forwarding it to the ranks of attempt {self.epoch}")
        self.ranks.signal(signal.SIGTERM)
        codes: list[int] = []
        straggler: float | None = None
        while self.ranks.running:
            for _, code in self.ranks.reap():
                codes.append(code)
                if code == ExitCode.SIGTERM and straggler is None:
                    straggler = time.monotonic() + STRAGGLER_SECONDS
            if straggler is not None and time.monotonic() > straggler:
                self.say("ranks did not exit after SIGTERM; killing them")
                self.ranks.kill()
                break
            time.sleep(0.05)
        failed = [c for c in codes if c not in (ExitCode.OK, ExitCode.SIGTERM)]
        if failed:
            return failed[0]
        return int(ExitCode.SIGTERM) if ExitCode.SIGTERM in codes else int(ExitCode.OK)
