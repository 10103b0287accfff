"""The in-place supervision loop of a launcher (`restartPolicy.strategy: InPlace`).

The launcher keeps its pod through a failed rank: it stops the pod's other ranks at once (they
would block in a collective), reports the failure to the coordinator, and waits for the
operator's decision, which the coordinator relays: stop the ranks of an older attempt, then
start the next attempt's ranks on a fresh rendezvous port. Nothing here decides a restart.

When the coordinator is gone it falls back to what a plain launcher does: healthy ranks keep
running, and a failed rank makes the launcher exit with the rank's code (or COORDINATOR_LOST
when it can tell nothing better), so the pod fails and the kubelet tells the operator.

With spare nodes (`fencing`), it also pings its coordinator and holds a lease (liveness.py):
when no ping of the last FENCE_SECONDS was granted it kills its ranks, whatever else happens, and
reports them failed once it reaches a coordinator again. A coordinator silent for SILENT_SECONDS
is lost; after RETRY_SECONDS more the launcher tries the candidates the coordinator named, in
order, and the first candidate that finds every one before it unreachable takes over (`take_over`
starts a coordinator in this process). A launcher whose node rank moved on is told to leave.

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
from megatron_contract.ladder import DECISION_TIMEOUT_SECONDS, HEARTBEAT_SECONDS, SILENT_SECONDS

from .coordinator import now_text
from .liveness import Lease
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
# With spare nodes: the lost coordinator is tried again this long before its successors are,
# each successor this long, and a launcher whose ranks fenced waits this long for one.
RETRY_SECONDS = 1.0
TRY_SECONDS = 1.5
FENCED_GRACE_SECONDS = DECISION_TIMEOUT_SECONDS


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
        fencing: bool = False,
        spare: int | None = None,
        ip: str | None = None,
        standby: int | None = None,
        take_over: Callable[[int, tuple[int, str] | None], tuple[str, int]] | None = None,
    ) -> None:
        self.node, self.pod, self.nproc = node, pod, nproc
        self.address = address
        # With spare nodes (liveness.py): the lease, the coordinator's term and who follows it.
        self.fencing = fencing
        self.spare, self.ip, self.standby = spare, ip, standby
        self.take_over = take_over
        self.lease = Lease()
        self.next_ping = 0.0
        self.heard = 0.0  # when the coordinator last said anything (monotonic)
        self.term = 0  # the newest coordinator term joined
        self.roster: list[tuple[str, str, int]] = []  # (pod, host, port): who coordinates next
        self.roster_term = 0
        self.leader: tuple[int | None, str | None] = (None, None)  # its node rank and pod
        self.succession: list[tuple[int, tuple[str, str, int]]] | None = (
            None  # (position, candidate) left
        )
        self.candidate_until = 0.0
        self.home = address  # the first address: tried again when every candidate failed
        self.unreported: Message | None = None  # ranks fenced while no coordinator listened
        self.leaving = False
        self.connected_at = 0.0
        self.deferred: tuple[Message, float] | None = None  # a start awaiting a valid lease
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
            if self.leaving:
                return int(ExitCode.SIGTERM)
            if self.terminating:
                continue
            if self.fencing:
                self._liveness(time.monotonic())
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
        if self.fencing:
            if self.welcomed:
                waits += [self.next_ping - now, self.heard + SILENT_SECONDS - now]
            if self.epoch is not None and self.lease.until is not None:
                waits.append(self.lease.until - now)
            if self.deferred is not None:
                waits.append(0.05)  # the zygote's imports or the lease: looked at this often
        return max(min(waits), 0.0)

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
        if self.fencing and not self._target(time.monotonic()):
            return
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
        # The coordinator's pod is never replaced within a gang (it moves to a surviving
        # launcher, which says where): its address, once resolved, holds, and reconnecting
        # needs no DNS.
        self.address = (str(sock.getpeername()[0]), self.address[1])
        self.conn = Conn(sock)
        self.connected_at = time.monotonic()
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
        if self.fencing:
            hello.update(spare=self.spare, ip=self.ip, standby=self.standby, term=self.term)
        hello["mac"] = hello_mac(self.key, challenge, hello)
        self._send(hello)
        held, self.held = self.held, []
        for message in held:
            self._send(message)

    def _welcome(self, m: Message) -> None:
        if self.challenge is None or self.welcomed:
            raise ProtocolError("an unexpected welcome")
        term = count(m, "term") if self.fencing else None
        expected = welcome_mac(self.key, self.challenge, self.own_nonce, term, m.get("pod"))
        if not same(m.get("mac"), expected):
            raise ProtocolError("a welcome without the job's key: not our coordinator")
        if term is not None and term < self.term:
            # A coordinator this launcher already left for a newer one (cut off, then back):
            # never again, or two majorities could overlap (liveness.py).
            raise ProtocolError(f"a coordinator of term {term}, older than {self.term}")
        if term is not None:
            self.term = term
            pod = m.get("pod")
            self.leader = (self.leader[0], pod if isinstance(pod, str) else None)
        self.welcomed = True
        self.connect_failures = 0
        self.connected_once = True
        self.lost_since = None
        self.succession = None
        now = time.monotonic()
        self.heard, self.next_ping = now, now
        if self.unreported is not None:
            held, self.unreported = self.unreported, None
            self._send(held)

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
        if not self.welcomed and self.fencing and self.succession is not None:
            self.candidate_until = 0.0  # refused by this candidate: the next one at once
            self.next_connect = time.monotonic()
            return
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
        self.heard = time.monotonic()
        if self.fencing and op == "pong":
            seq = count(m, "seq")
            if seq is None:
                raise ProtocolError(f"bad pong {m!r}")
            self.lease.answer(seq, m.get("ok") is True, self.heard)
            return
        if self.fencing and op == "roster":
            self._roster(m)
            return
        attempt = count(m, "attempt")
        if attempt is None:
            raise ProtocolError(f"no attempt in {m!r}")
        if op == "stop":
            if m.get("leave") is True:
                # This pod's node rank moved onto another pod while it was cut off.
                if self.ranks.running:
                    self.ranks.kill()
                self.say(f"node rank {self.node}'s place moved to another pod: leaving")
                self.epoch = None
                self.leaving = True
                return
            deferred = count(self.deferred[0], "attempt") if self.deferred is not None else None
            if deferred is not None and deferred < attempt:
                self.deferred = None  # a start not made yet: never made now
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
            if self.fencing and not self._placed(m, attempt):
                return
            self._start(attempt, port)
        else:
            raise ProtocolError(f"unknown op {op!r}")

    def _start(self, attempt: int, port: int) -> None:
        """Start the ranks of `attempt` (a start deferred until the lease comes, too)."""
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

    # --- with spare nodes: the lease, the coordinator's silence, and its successors
    def _placed(self, m: Message, attempt: int) -> bool:
        """Before a start: the node rank and rendezvous host the coordinator gives; False (and
        the attempt reported failed) when the lease is not valid."""
        node, master = count(m, "node", 65535), m.get("master")
        if node is None or not isinstance(master, str):
            raise ProtocolError(f"no node or master in {m!r}")
        place = getattr(self.ranks, "place", None)
        if place is not None:
            place(node, master)
        if node != self.node:
            self.say(f"running node rank {node} (this pod's own is {self.node})")
        if not self.lease.valid(time.monotonic()) or not self._ranks_ready():
            # The next granted ping makes it valid; started then, or reported failed. A zygote
            # still importing is waited for here, in the loop, never inside `start`: the
            # launcher keeps pinging meanwhile (a launcher blocked for seconds is a lost one).
            self.deferred = (m, time.monotonic() + self.lease.fence_seconds)
            return False
        return True

    def _ranks_ready(self) -> bool:
        ready = getattr(self.ranks, "ready", None)
        return ready is None or bool(ready())

    def _fenced_report(self, epoch: int) -> Message:
        code = int(ExitCode.COORDINATOR_LOST)
        return {"op": "failed", "epoch": epoch, "local": 0, "code": code, "time": now_text()}

    def _liveness(self, now: float) -> None:
        if not self.welcomed and self.conn is not None and now - self.connected_at > TRY_SECONDS:
            self.conn.close()  # connected, but no handshake: a host that takes and says nothing
            self._disconnected()
        if self.welcomed and self.conn is not None:
            if now - self.heard > SILENT_SECONDS:
                self.say(f"the coordinator is silent for {now - self.heard:.1f}s: lost")
                self.conn.close()
                self._disconnected()
            elif now >= self.next_ping:
                self.next_ping = now + HEARTBEAT_SECONDS
                self._send({"op": "ping", "seq": self.lease.ping(now)})
        if self.deferred is not None:
            m, until = self.deferred
            attempt, port = count(m, "attempt"), count(m, "port", 65535)
            if not self._ranks_ready():
                # The lease's wait starts once the ranks could start.
                self.deferred = (m, max(until, now + self.lease.fence_seconds))
            elif self.lease.valid(now) and attempt is not None and port is not None:
                self.deferred = None
                self._start(attempt, port)
            elif now > until and attempt is not None:
                self.deferred = None
                self.say(f"told to start attempt {attempt}, and no lease came: not starting it")
                self._send(self._fenced_report(attempt))
        if self.epoch is not None and not self.lease.valid(now):
            epoch = self.epoch
            self.ranks.kill()
            self.epoch = None
            self.say(
                f"no lease from a coordinator for {self.lease.fence_seconds:.0f}s: killed the "
                f"ranks of attempt {epoch} (fenced), before their node rank can move"
            )
            report = self._fenced_report(epoch)
            if self.conn is not None and self.welcomed:
                self._send(report)
            else:
                self.unreported = report

    def _roster(self, m: Message) -> None:
        candidates = m.get("candidates")
        term = count(m, "term")
        if term is None or not isinstance(candidates, list):
            raise ProtocolError(f"bad roster {m!r}")
        roster: list[tuple[str, str, int]] = []
        for item in candidates[:16]:
            ok = isinstance(item, list) and len(item) == 3
            if ok and isinstance(item[0], str) and isinstance(item[1], str):
                port = item[2]
                if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
                    roster.append((item[0], item[1], port))
        pod = m.get("coordinator")
        self.roster, self.roster_term = roster, term
        self.leader = (count(m, "node", 65535), pod if isinstance(pod, str) else None)

    def _target(self, now: float) -> bool:
        """Where to connect now (self.address); False: nowhere yet. While the lost coordinator
        was lost for less than RETRY_SECONDS it is tried again; then each candidate in turn,
        for TRY_SECONDS each, and this launcher's own turn starts a coordinator here."""
        if self.lost_since is None or not self.roster or now - self.lost_since < RETRY_SECONDS:
            return True
        if self.succession is None:
            self.succession = list(enumerate(self.roster, 1))
            self.candidate_until = 0.0
        if now < self.candidate_until:
            return True
        if not self.succession:  # every candidate failed: the first address, then round again
            self.succession, self.address = None, self.home
            self.lost_since = now
            return True
        position, (pod, host, port) = self.succession.pop(0)
        self.candidate_until = now + TRY_SECONDS
        if pod != self.pod:
            self.address = (host, port)
            return True
        if self.take_over is None:
            return False
        term = self.roster_term + position
        node, lost = self.leader
        self.say(f"every candidate before this pod is unreachable: coordinating (term {term})")
        self.address = self.take_over(term, (node, lost) if node is not None and lost else None)
        self.take_over = None  # once
        self.term = max(self.term, term)
        return True

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
            grace = FENCED_GRACE_SECONDS if self.fencing else RECONNECT_GRACE_SECONDS
            if gone is not None and idle and now - gone > grace:
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
