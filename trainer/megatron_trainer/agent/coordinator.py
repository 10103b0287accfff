"""The coordinator: in the launcher of node rank 0, every launcher's one connection.

It holds three things and nothing else:
- the operator's decision, from a `Source` (the job's status): `restartAttempt`, and whether
  the phase releases it (not `Restarting`);
- the launchers: which node ranks are connected, which attempt their ranks run;
- the report for the operator, through a `Sink`: the rank failures of the attempt the gang
  runs, the launchers whose connection dropped, and when the gang (re)started.

On a decision it tells every launcher running an older attempt to stop; once the attempt is
released and every node rank is connected with nothing running (the barrier), it tells all of
them to start it, on a fresh rendezvous port. One thread, one `selectors` loop: at 4,096
launchers a decision is 4,096 small writes on connections that are already open.

Its port is reachable by other tenants' pods, so only a launcher that proves it holds the job's
key joins (wire.py): a connection is challenged at once, closed if it has not said a valid hello
within HELLO_TIMEOUT_SECONDS, and at most MAX_PENDING such connections are kept (the oldest goes
when another arrives). A node rank is held by one connection: a second hello for it is refused
while the first is open (TCP keepalive closes one whose peer vanished within ~30 s).

With spare nodes (`spares` > 0) it also keeps the launchers alive and fenced (liveness.py): it
answers their pings, granting leases only while it hears a majority; a launcher silent for
SILENT_SECONDS is lost; a node rank moves (the decision's `swaps`) only once its old holder has
surely fenced; it tells each launcher the node rank it runs and the rendezvous host of the
attempt, tells a launcher whose rank moved on to leave, lists the idle spares in its report,
and sends the launchers the candidates to coordinate after it (the lowest node ranks, then the
spares), one of which takes over if it is lost (`term` counts the takeovers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import resource
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from megatron_contract.ladder import (
    FENCE_SECONDS,
    HEARTBEAT_SECONDS,
    MAX_FAILURES,
    PHASE_RESTARTING,
    PHASES_ENDED,
    SILENT_SECONDS,
    Decision,
    LostLauncher,
    RankFailure,
    Report,
)
from megatron_contract.ports import free_port

from .liveness import Fences, majority, successor_wait
from .sources import Sink, Source
from .wire import (
    HELLO_TIMEOUT_SECONDS,
    MAX_PENDING,
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

DROP_LOG_WINDOW_SECONDS = 60.0
DROP_LOG_PER_WINDOW = 5

# Failures and dropped launchers arrive in bursts (one rank dies, its peers lose it a moment
# later): the report waits this long for the rest of the burst before it is written.
REPORT_SETTLE_SECONDS = 0.05
# The candidates to coordinate next that every launcher is told (the lowest node ranks first).
CANDIDATES = 8
# With spare nodes, a report naming lost launchers is written again this often until a decision
# answers it: another coordinator's write (one that lost its place) may have replaced it.
REPORT_REFRESH_SECONDS = 2.0
# With spare nodes, every launcher's silence, the majority and the roster are looked at this often.
LIVENESS_SECONDS = HEARTBEAT_SECONDS / 4


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def raise_fd_limit() -> None:
    """One descriptor per launcher: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# A launcher whose pod vanished (its node lost) leaves a connection that is open on our side
# only: keepalive probes close it within ~30 s, so its replacement's hello is not refused for long.
KEEPALIVE = (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4))


def keepalive(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in KEEPALIVE:
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


@dataclass
class Client:
    challenge: str
    since: float  # when it connected (monotonic): a hello is due within HELLO_TIMEOUT_SECONDS
    node: int | None = None  # None until its valid hello
    pod: str = ""
    leaving: bool = False  # it said bye: its connection ending is no loss
    epoch: int | None = None  # the attempt its ranks run; None: no rank runs
    failed: int | None = None  # the attempt a rank of which it reported failed
    stop_sent: int = -1
    # With spare nodes:
    spare: int | None = None  # a spare pod's number
    ip: str = ""  # its pod's IP (the hello's, else the connection's)
    standby: int | None = None  # where it would coordinate were this coordinator lost
    heard: float = 0.0  # when it last said anything (monotonic)
    granted: float | None = None  # when a ping of it was last answered with a lease
    holds: int | None = None  # the node rank it was told to run
    leave_sent: bool = False


class Coordinator:
    def __init__(
        self,
        nodes: int,
        attempt: int,
        first_port: int,
        bind: str,
        port: int,
        source: Source | None,
        sink: Sink,
        say: Callable[[str], None] | None = None,
        *,
        key: bytes,
        spares: int = 0,
        pod: str | None = None,
        term: int = 0,
        listener: socket.socket | None = None,
        predecessor: tuple[int, str] | None = None,
    ) -> None:
        self.say = say or (lambda text: log.info("%s", text))
        self.key = key
        self.nodes = nodes
        self.decided = attempt  # status.restartAttempt (the pod's own attempt until it is read)
        self.released = attempt  # the newest attempt whose ranks may start
        self.ended = False
        self.started_attempt: int | None = None  # the attempt the gang was last told to start
        self.first_port = first_port
        self.bind = bind
        self.source = source
        self.sink = sink
        self.clients: dict[Conn, Client] = {}
        self.pending: dict[Conn, None] = {}  # connected, no valid hello yet: oldest first
        self.drops_since, self.drops_said, self.drops_unsaid = time.monotonic(), 0, 0
        self.by_node: dict[int, Conn] = {}
        self.lost: dict[int, LostLauncher] = {}
        self.failures: list[RankFailure] = []
        self.started: set[int] = set()
        self.started_at: str | None = None
        self.seen_at: str | None = None
        self.report_due: float | None = None
        self.decisions: queue.SimpleQueue[Decision] = queue.SimpleQueue()
        self.stopping = False
        # With spare nodes: liveness and fencing (liveness.py), the swaps, and the takeovers.
        self.spare_count = spares
        self.fencing = spares > 0
        self.pod = pod
        self.term = term
        self.swaps: dict[int, str] = {}
        self.held: set[str] = set()  # pods that ever held a moved node rank
        self.by_pod: dict[str, Conn] = {}
        self.fences = Fences()
        self.quorum = False
        self.quorum_since: float | None = None
        self.ready_at: float | None = None  # a successor starts nothing before this
        self.roster: list[list[object]] = []
        self.spares_said: tuple[str, ...] = ()
        self.lost_decided: int | None = None  # the decision that stood when a loss was seen
        self.refresh_at = 0.0
        self.liveness_due = 0.0
        self.changed = True  # something _act reads changed since it last ran (with spares)
        if predecessor is not None:  # we took over from it: it is lost, as far as we know
            node, lost_pod = predecessor
            self.lost[node] = LostLauncher(node, lost_pod[:253], now_text())
            self.lost_decided = attempt
        raise_fd_limit()
        family = socket.AF_INET6 if ":" in bind else socket.AF_INET
        if listener is not None:  # bound by the launcher when it started (a standby's port)
            listener.listen(4096)
            self.listener = listener
        else:
            self.listener = socket.create_server(
                (bind, port), family=family, backlog=4096, reuse_port=False
            )
        self.listener.setblocking(False)
        self.port = int(self.listener.getsockname()[1])
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self.serve, name="coordinator", daemon=True)

    # --- lifecycle
    def start(self) -> None:
        if self.source is not None:
            self.source.start(self.deliver)
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self._wake()
        if self.source is not None:
            self.source.stop()
        self.thread.join(timeout=5)
        self.sink.close()

    def deliver(self, decision: Decision) -> None:
        """The source's thread hands over a status (restartAttempt, phase, swaps)."""
        self.decisions.put(decision)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe: the loop is awake anyway
            os.write(self.wake_w, b"x")

    # --- the loop
    def serve(self) -> None:
        while not self.stopping:
            due = [d for d in (self.report_due, self._hello_due()) if d is not None]
            if self.fencing:  # the launchers' silence and the majority are checked this often
                due.append(self.liveness_due)
            timeout = max(min(due) - time.monotonic(), 0.0) if due else None
            for key, events in self.selector.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    self._drain_wake()
                else:
                    conn = key.fileobj
                    assert isinstance(conn, Conn)
                    if events & selectors.EVENT_WRITE:
                        conn.flush()
                    if events & selectors.EVENT_READ and not conn.closed:
                        self._read(conn)
                    self._watch_writes(conn)
            self._expire(time.monotonic())
            while not self.decisions.empty():
                self._decided(self.decisions.get())
            now = time.monotonic()
            if self.fencing and now >= self.liveness_due:
                # A look over every launcher: a few times a heartbeat, not at every message
                # (2,000 pings a second at 1,024 launchers would make it quadratic).
                self.liveness_due = now + LIVENESS_SECONDS
                self._liveness(now)
                self.changed = True  # the waits of a start (fences, a successor's) are timed
            if self.changed or not self.fencing:
                # Pings change nothing _act reads but the leases, which the look above covers.
                self.changed = False
                self._act()
            if self.report_due is not None and time.monotonic() >= self.report_due:
                self.report_due = None
                if not self.fencing or self.quorum:
                    # Without a majority, this side's view of who is lost may be the cut-off
                    # one's: it writes nothing (the report stays the last one of a majority).
                    self.sink.submit(self.report())
        for conn in list(self.clients):
            conn.close()
        self.listener.close()

    def _drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # out of descriptors: drop this one, keep serving
                log.warning("coordinator: accept failed: %s", err)
                return
            if len(self.pending) >= MAX_PENDING:
                self._gone(next(iter(self.pending)))  # the oldest: a launcher's hello takes ms
            keepalive(sock)
            conn = Conn(sock)
            client = Client(challenge=nonce(), since=time.monotonic())
            self.clients[conn] = client
            self.pending[conn] = None
            self.selector.register(conn, selectors.EVENT_READ, "client")
            self._send(conn, {"op": "challenge", "nonce": client.challenge})

    def _hello_due(self) -> float | None:
        """When the oldest connection without a hello is due to be closed."""
        for conn in self.pending:  # in order of arrival
            return self.clients[conn].since + HELLO_TIMEOUT_SECONDS
        return None

    def _expire(self, now: float) -> None:
        while self.pending:
            conn = next(iter(self.pending))
            if now - self.clients[conn].since < HELLO_TIMEOUT_SECONDS:
                return
            self._gone(conn)

    def _watch_writes(self, conn: Conn) -> None:
        if conn not in self.clients:
            return
        if conn.closed:
            self._gone(conn)
            return
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.wants_write else 0)
        self.selector.modify(conn, mask, "client")

    def _read(self, conn: Conn) -> None:
        try:
            for message in conn.receive():
                if conn not in self.clients:
                    break  # an answer's write found the connection broken: it is gone
                self._handle(conn, message)
        except ProtocolError as err:
            self._dropped(str(err))
            conn.close()
        if conn.closed:
            self._gone(conn)

    def _dropped(self, why: str) -> None:
        """Say why a connection was dropped: the first few a minute, then how many more (a
        peer that reconnects in a loop must not flood the pod's log)."""
        now = time.monotonic()
        if now - self.drops_since >= DROP_LOG_WINDOW_SECONDS:
            if self.drops_unsaid:
                log.warning(
                    "coordinator: dropped %d more connections in the last minute",
                    self.drops_unsaid,
                )
            self.drops_since, self.drops_said, self.drops_unsaid = now, 0, 0
        if self.drops_said < DROP_LOG_PER_WINDOW:
            self.drops_said += 1
            log.warning("coordinator: dropping a connection: %s", why)
        else:
            self.drops_unsaid += 1

    def _gone(self, conn: Conn) -> None:
        self.changed = True
        self.pending.pop(conn, None)
        client = self.clients.pop(conn, None)
        if client is None:
            return
        self.selector.unregister(conn)
        conn.close()
        if client.node is None:
            return
        # The node rank it held: the one it was told to run (a spare's, too) while it is still
        # that rank's holder, else its own when it is a node rank's pod. An idle spare holds
        # none: its loss restarts nothing (the operator makes it again from its pod's state).
        rank: int | None = None
        if client.holds is not None and self._holder(client.holds) is conn:
            rank = client.holds
        elif client.spare is None and self.by_node.get(client.node) is conn:
            rank = client.node
        if self.by_pod.get(client.pod) is conn:
            del self.by_pod[client.pod]
            idle_spare = client.spare is not None and client.holds is None
            if not client.leaving and not idle_spare:
                # Its ranks may run on (a network cut): no attempt starts before they fenced.
                self.fences.lost(client.pod, client.granted)
        if self.by_node.get(client.node) is conn:
            del self.by_node[client.node]
        if rank is None or client.leaving:
            return
        self.lost[rank] = LostLauncher(rank, client.pod, now_text())
        self.lost_decided = self.decided
        log.warning("coordinator: the launcher of %s (node rank %d) dropped", client.pod, rank)
        self._report_soon(REPORT_SETTLE_SECONDS)

    def _send(self, conn: Conn, message: Message) -> None:
        conn.send(message)
        self._watch_writes(conn)

    # --- messages
    def _handle(self, conn: Conn, m: Message) -> None:
        client = self.clients[conn]
        op = m["op"]
        if op != "ping":
            self.changed = True
        if op == "hello":
            node = count(m, "node", self.nodes + self.spare_count - 1)
            pod = m.get("pod")
            spare = count(m, "spare", 4095)
            if node is None or client.node is not None or not isinstance(pod, str):
                raise ProtocolError("bad hello")
            if spare is not None and node != self.nodes + spare:
                raise ProtocolError("bad hello")
            if not is_nonce(m.get("nonce")) or not same(
                m.get("mac"), hello_mac(self.key, client.challenge, m)
            ):
                raise ProtocolError(f"a hello as node rank {node} without the job's key")
            older = self.by_node.get(node)
            moved = self.fencing and node in self.swaps and self.swaps[node] != pod
            if spare is not None:
                # A spare is known by its pod (below): a spare number whose pod holds a node rank
                # is made again, and the old pod, reconnecting, keeps its rank.
                moved = True
            if older is not None and older is not conn and not older.closed and not moved:
                # Held by an open connection: a second hello is refused (never the newer one
                # winning), so no peer can take a launcher's place.
                raise ProtocolError(f"node rank {node} is already connected")
            same_pod = self.by_pod.get(pod[:253])
            if same_pod is not None and same_pod is not conn and not same_pod.closed:
                raise ProtocolError(f"pod {pod[:253]} is already connected")
            client.node, client.pod, client.epoch = node, pod[:253], count(m, "epoch")
            client.spare, client.heard = spare, time.monotonic()
            ip, standby = m.get("ip"), count(m, "standby", 65535)
            client.ip = ip[:45] if isinstance(ip, str) and ip else _peer_ip(conn)
            client.standby = standby
            self.pending.pop(conn, None)
            if not moved or (spare is not None and client.pod not in self.held):
                self.by_node[node] = conn  # a node rank's pod, or the idle spare of that number
            self.by_pod[client.pod] = conn
            welcome: Message = {"op": "welcome"}
            if self.fencing:
                welcome.update(term=self.term, pod=self.pod)
                welcome["mac"] = welcome_mac(
                    self.key, client.challenge, m["nonce"], self.term, self.pod
                )
            else:
                welcome["mac"] = welcome_mac(self.key, client.challenge, m["nonce"])
            self._send(conn, welcome)
            if client.epoch is None:
                self.fences.back(client.pod)
            if self.fencing:
                self._send_roster(conn)
            back = [r for r, x in self.lost.items() if x.pod == client.pod]
            for r in back:  # its own launcher again (a lost pod's, or a restarted one's)
                del self.lost[r]
            own = client.spare is None and not self._displaced(client)
            if own and self.lost.pop(node, None) is not None:  # a node rank's new pod
                back.append(node)
            if back:
                self._report_soon(0.0)
            return
        if client.node is None:
            raise ProtocolError(f"{op!r} before hello")
        client.heard = time.monotonic()
        if op == "ping" and self.fencing:
            seq = count(m, "seq")
            if seq is None:
                raise ProtocolError(f"bad ping {m!r}")
            ok = self.quorum and not self._displaced(client)
            if ok:
                client.granted = client.heard
            self._send(conn, {"op": "pong", "seq": seq, "ok": ok})
            return
        if op == "failed":
            epoch, local, code = count(m, "epoch"), count(m, "local"), count(m, "code", 255)
            when = m.get("time")
            if epoch is None or local is None or code is None or not isinstance(when, str):
                raise ProtocolError(f"bad failure {m!r}")
            client.failed = epoch
            if epoch == self.started_attempt and len(self.failures) < MAX_FAILURES:
                rank = client.holds if client.holds is not None else client.node
                self.failures.append(RankFailure(rank, local, code, when[:64]))
                self._report_soon(REPORT_SETTLE_SECONDS)
        elif op == "stopped":
            client.epoch = None
            self.fences.back(client.pod)
        elif op == "bye":
            client.leaving = True
        elif op == "started":
            epoch = count(m, "epoch")
            client.epoch = epoch
            if epoch is not None and epoch == self.started_attempt:
                self.started.add(client.holds if client.holds is not None else client.node)
                if len(self.started) == self.nodes:
                    self.started_at = now_text()
                    self._report_soon(0.0)
        else:
            raise ProtocolError(f"unknown op {op!r}")

    def _decided(self, decision: Decision) -> None:
        self.changed = True
        attempt, phase = decision.attempt, decision.phase
        if attempt < self.decided:
            return  # an older version of the status than one already seen
        if self.fencing:
            self.swaps = {r: p for r, p in decision.swaps if 0 <= r < self.nodes}
            self.held.update(self.swaps.values())
        self.decided = attempt
        self.ended = phase in PHASES_ENDED
        if phase != PHASE_RESTARTING and attempt > self.released:
            self.released = attempt
            self.seen_at = now_text()

    def _act(self) -> None:
        """Stop what is older than the decision; start the released attempt behind a barrier."""
        for conn, c in list(self.clients.items()):
            running = c.epoch is not None and c.epoch < self.decided
            # A launcher whose rank failed runs nothing and waits for a decision: told of it
            # too, it then waits for the release however long the backoff, instead of ending
            # its pod after DECISION_TIMEOUT_SECONDS (which would recreate the gang).
            waiting = c.epoch is None and c.failed is not None and c.failed < self.decided
            if (running or waiting) and c.stop_sent < self.decided:
                c.stop_sent = self.decided
                self._send(conn, {"op": "stop", "attempt": self.decided})
        if self.fencing:
            for conn, c in list(self.clients.items()):
                if c.node is not None and not c.leave_sent and self._displaced(c):
                    # Its node rank moved on (it was lost, and is back): it stops and leaves.
                    c.leave_sent = True
                    self._send(conn, {"op": "stop", "attempt": self.decided, "leave": True})
        if self.ended or self.released < self.decided:
            return
        if self.started_attempt is not None and self.released <= self.started_attempt:
            return
        ready = [self._holder(r) for r in range(self.nodes)]
        if any(
            c is None or c not in self.clients or self.clients[c].epoch is not None for c in ready
        ):
            return  # the barrier: every node rank connected, no rank of an older attempt alive
        if self.fencing and not self._may_start(time.monotonic(), ready):
            return
        first = self.started_attempt is None and self.term == 0
        port = self.first_port if first else free_port(self.bind)
        self.started_attempt = self.released
        self.failures, self.started, self.started_at = [], set(), None
        start: Message = {"op": "start", "attempt": self.released, "port": port}
        if self.source is None:
            start["inPlace"] = False  # no decision can reach us: a failed rank ends its pod
        if self.fencing:
            rank0 = ready[0]
            assert rank0 is not None
            start["master"] = self.clients[rank0].ip
        for rank, member in enumerate(ready):
            assert member is not None
            self.clients[member].holds = rank
            self._send(member, {**start, "node": rank} if self.fencing else start)
        self.say(
            f"coordinator: attempt {self.released} starts on {self.nodes} launcher(s) "
            f"(rendezvous port {port})"
        )

    def _report_soon(self, delay: float) -> None:
        due = time.monotonic() + delay
        self.report_due = due if self.report_due is None else min(self.report_due, due)

    def report(self) -> Report:
        lost = tuple(self.lost[n] for n in sorted(self.lost))
        if self.fencing and not self.quorum:
            lost = ()  # without a majority, who is lost is only this side's view
        return Report(
            attempt=self.started_attempt if self.started_attempt is not None else self.decided,
            nodes=self.nodes,
            started=len(self.started),
            started_at=self.started_at,
            seen_at=self.seen_at,
            failures=tuple(self.failures),
            lost=lost,
            coordinator=self.pod if self.fencing else None,
            term=self.term,
            quorum=self.quorum if self.fencing else None,
            spares=self.spares_said,
        )

    # --- with spare nodes: liveness, fencing, holders, successors (liveness.py)
    def _holder(self, rank: int) -> Conn | None:
        """The connection of the launcher that runs node rank `rank` in the decided attempt."""
        pod = self.swaps.get(rank)
        return self.by_pod.get(pod) if pod is not None else self.by_node.get(rank)

    def _displaced(self, c: Client) -> bool:
        """Its node rank is another pod's now (it was lost, then came back)."""
        if c.node is None or c.pod in self.swaps.values():
            return False
        if c.spare is None:
            return c.node in self.swaps
        return c.pod in self.held  # a spare that held a rank, since given to another pod

    def _liveness(self, now: float) -> None:
        """Drop the launchers silent for SILENT_SECONDS, count who is heard, and keep the
        report's quorum, spares and the roster of candidates current."""
        for conn, c in list(self.clients.items()):
            if c.node is not None and now - c.heard > SILENT_SECONDS:
                log.warning(
                    "coordinator: the launcher of %s (node %d) is silent for %.1fs: lost",
                    c.pod,
                    c.node,
                    now - c.heard,
                )
                with contextlib.suppress(OSError):  # a reset: nothing queued reaches it later
                    conn.sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                self._gone(conn)
        members = [
            c for c in self.clients.values() if c.node is not None and not self._displaced(c)
        ]
        quorum = majority(len(members), self.nodes + self.spare_count)
        if quorum != self.quorum:
            self.quorum = quorum
            self.quorum_since = now if quorum else None
            if quorum and self.term > 0 and self.ready_at is None:
                self.ready_at = successor_wait(now)
            self.say(
                f"coordinator: {'hears' if quorum else 'no longer hears'} a majority of the "
                f"launchers ({len(members)} of {self.nodes + self.spare_count})"
            )
            self._report_soon(0.0)
        idle = tuple(
            sorted(
                c.pod
                for c in members
                if c.spare is not None and c.pod not in self.held and c.epoch is None
            )
        )
        if idle != self.spares_said:
            self.spares_said = idle
            self._report_soon(REPORT_SETTLE_SECONDS)
        waiting = self.lost and self.lost_decided == self.decided
        if self.quorum and waiting and now >= self.refresh_at:
            self.refresh_at = now + REPORT_REFRESH_SECONDS
            self._report_soon(0.0)
        roster = self._candidates()
        if roster != self.roster:
            self.roster = roster
            for conn, c in self.clients.items():
                if c.node is not None:
                    self._send_roster(conn)

    def _may_start(self, now: float, holders: list[Conn | None]) -> bool:
        """A majority is heard, every holder holds a lease (it would not start its ranks
        otherwise), a successor has waited out its predecessor's leases, and every launcher
        lost while its ranks ran has surely fenced."""
        if not self.quorum:
            return False
        fresh = now - FENCE_SECONDS + 2 * HEARTBEAT_SECONDS
        for conn in holders:
            granted = self.clients[conn].granted if conn is not None else None
            if granted is None or granted < fresh:
                return False
        # (The loop looks again every LIVENESS_SECONDS.)
        if self.ready_at is not None and now < self.ready_at:
            return False
        if self.fences.wait(now) is not None:
            return False
        # A launcher of an older attempt still running ranks (its rank moved on) stops first.
        return all(c.epoch is None for c in self.clients.values() if c.node is not None)

    def _candidates(self) -> list[list[object]]:
        """Who coordinates if this coordinator is lost, in order: the launchers of the lowest
        node ranks, then the idle spares (each with the address it would listen on)."""
        out: list[list[object]] = []
        for rank in range(self.nodes):
            conn = self._holder(rank)
            c = self.clients.get(conn) if conn is not None else None
            if c is not None and c.standby is not None and c.pod != self.pod:
                out.append([c.pod, c.ip, c.standby])
            if len(out) >= CANDIDATES:
                return out
        for c in sorted(self.clients.values(), key=lambda x: (x.spare or 0, x.pod)):
            idle = c.spare is not None and c.pod not in self.held
            if idle and c.standby is not None and len(out) < CANDIDATES:
                out.append([c.pod, c.ip, c.standby])
        return out

    def _own_rank(self) -> int | None:
        """The node rank this coordinator's own pod runs (a successor reports it lost)."""
        for rank in range(self.nodes):
            conn = self._holder(rank)
            if conn is not None and self.clients[conn].pod == self.pod:
                return rank
        return None

    def _send_roster(self, conn: Conn) -> None:
        self._send(
            conn,
            {
                "op": "roster",
                "term": self.term,
                "coordinator": self.pod,
                "node": self._own_rank(),
                "candidates": self.roster,
            },
        )


def _peer_ip(conn: Conn) -> str:
    try:
        return str(conn.sock.getpeername()[0])
    except (OSError, IndexError):
        return ""
