"""Liveness and fencing with spare nodes, below the processes (test_spare_fencing.py has them):

- the lease and fence rules (agent/liveness.py) as properties over any timing of pings, answers,
  delays and cuts: a node rank moves only once its old holder's lease has surely ended;
- the wire additions as a contract (agent/wire.py): the MACs bind the spare fields, and a real
  coordinator with spares answers pings, grants only with a majority, tells each launcher its
  node rank and the rendezvous host, names its successors, and refuses a spare that claims a
  node rank. Under 2 s in all."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_contract.ladder import (
    FENCE_MARGIN_SECONDS,
    FENCE_SECONDS,
    HEARTBEAT_SECONDS,
    SILENT_SECONDS,
    Decision,
    Report,
)
from megatron_contract.ports import free_port
from megatron_trainer.agent.coordinator import Coordinator
from megatron_trainer.agent.liveness import Fences, Lease, majority, successor_wait
from megatron_trainer.agent.wire import encode, hello_mac, welcome_mac

KEY = b"k" * 32


# --- the rules, as properties ------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 2.0),  # the wait before this ping is sent
            st.floats(0.0, 10.0),  # its round trip (a slow or congested network)
            st.booleans(),  # granted (the coordinator heard a majority)
            st.booleans(),  # lost on the way (a cut)
        ),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.0, 20.0),
)
def test_a_lease_never_outlives_the_coordinators_last_grant_by_more_than_the_fence(
    pings: list[tuple[float, float, bool, bool]], probe: float
) -> None:
    """Whatever the delays, answers out of order or lost: the launcher holds a lease at time t
    only if the coordinator granted a ping at some g with t < g + FENCE_SECONDS; so once the
    coordinator's `Fences` wait (last grant + FENCE + MARGIN) is over, the launcher has fenced."""
    lease = Lease()
    now, grants, answers = 0.0, [], []
    for wait, trip, granted, dropped in pings:
        now += wait
        seq = lease.ping(now)
        if not dropped:
            # The coordinator answers half-way through the trip; the answer lands at now + trip.
            grant_time = now + trip / 2
            if granted:
                grants.append(grant_time)
            answers.append((now + trip, seq, granted))
    events = sorted(answers)
    t = 0.0
    for when, seq, granted in events:
        t = when
        lease.answer(seq, granted, when)
        if lease.valid(t):
            assert any(g <= t < g + FENCE_SECONDS for g in grants)
    end = t + probe
    if lease.valid(end):
        assert grants and end < max(grants) + FENCE_SECONDS
    fences = Fences()
    fences.lost("pod", max(grants) if grants else None)
    until = fences.wait(end)
    if until is None or until <= end:  # the coordinator would move the rank now
        assert not lease.valid(end)


def test_the_fence_rules_in_numbers() -> None:
    """The timing the architecture documents: detection after SILENT_SECONDS, fence after
    FENCE_SECONDS, a move no earlier than FENCE + MARGIN after the last grant, a successor
    waiting SILENT + FENCE + MARGIN after it first hears a majority."""
    assert HEARTBEAT_SECONDS < SILENT_SECONDS < FENCE_SECONDS
    assert 4 * HEARTBEAT_SECONDS <= SILENT_SECONDS  # a lost ping or two is no loss
    fences = Fences()
    fences.lost("a", 100.0)
    fences.lost("b", None)  # never granted: its ranks never ran under a lease
    assert fences.wait(100.0) == 100.0 + FENCE_SECONDS + FENCE_MARGIN_SECONDS
    fences.back("a")  # came back with no rank running
    assert fences.wait(100.0) is None
    assert successor_wait(7.0) == 7.0 + SILENT_SECONDS + FENCE_SECONDS + FENCE_MARGIN_SECONDS
    assert [majority(p, 3) for p in range(4)] == [False, False, True, True]
    assert not majority(2, 4) and majority(3, 4) and not majority(0, 0)
    lease = Lease()
    first = lease.ping(0.0)
    second = lease.ping(0.5)
    lease.answer(second, True, 0.6)
    lease.answer(first, True, 0.7)  # late, and older: extends nothing
    assert lease.until == 0.5 + FENCE_SECONDS
    assert lease.valid(3.4) and not lease.valid(3.5)
    refused = lease.ping(1.0)
    lease.answer(refused, False, 1.1)  # alive, but no majority behind it: no extension
    assert lease.until == 0.5 + FENCE_SECONDS and lease.heard == 1.1


# --- the wire, as a contract -------------------------------------------------------------------
def test_the_macs_bind_the_spare_fields_and_keep_the_old_form_without_them() -> None:
    hello = {"op": "hello", "node": 1, "pod": "job-a0-1", "epoch": None, "nonce": "ab" * 32}
    plain = hello_mac(KEY, "cd" * 32, hello)
    spared = {**hello, "spare": None, "ip": "10.0.0.2", "standby": 29501, "term": 0}
    assert hello_mac(KEY, "cd" * 32, spared) != plain
    for field, value in (("spare", 0), ("ip", "10.0.0.9"), ("standby", 1), ("term", 1)):
        assert hello_mac(KEY, "cd" * 32, {**spared, field: value}) != hello_mac(
            KEY, "cd" * 32, spared
        ), field
    # Without spares the welcome is the one launchers of a job without spares check.
    assert welcome_mac(KEY, "cd" * 32, "ab" * 32) == welcome_mac(KEY, "cd" * 32, "ab" * 32, None)
    with_term = welcome_mac(KEY, "cd" * 32, "ab" * 32, 1, "job-a0-1")
    assert with_term != welcome_mac(KEY, "cd" * 32, "ab" * 32, 2, "job-a0-1")
    assert with_term != welcome_mac(KEY, "cd" * 32, "ab" * 32, 1, "job-a0-0")


class _Sink:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def submit(self, report: Report) -> None:
        self.reports.append(report)

    def close(self) -> None:
        pass


class _Source:
    def __init__(self) -> None:
        self.deliver: Any = None

    def start(self, deliver: Any) -> None:
        self.deliver = deliver

    def stop(self) -> None:
        pass


@pytest.fixture
def coordinator() -> Iterator[tuple[Coordinator, _Source, _Sink]]:
    source, sink = _Source(), _Sink()
    c = Coordinator(
        2, 0, free_port(), "127.0.0.1", 0, source, sink, key=KEY, spares=1, pod="job-a0-0"
    )
    c.start()
    try:
        yield c, source, sink
    finally:
        c.stop()


class Peer:
    """A launcher spoken by hand: the handshake, then line by line."""

    def __init__(self, port: int, node: int, pod: str, spare: int | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.file = self.sock.makefile("rb")
        challenge = self.read()["nonce"]
        hello: dict[str, Any] = {
            "op": "hello",
            "node": node,
            "pod": pod,
            "epoch": None,
            "nonce": "ab" * 32,
            "spare": spare,
            "ip": "127.0.0.1",
            "standby": 40000 + node,
            "term": 0,
        }
        hello["mac"] = hello_mac(KEY, challenge, hello)
        self.challenge = challenge
        self.send(hello)

    def send(self, m: dict[str, Any]) -> None:
        self.sock.sendall(encode(m))

    def read(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "closed"
        return dict(json.loads(line))

    def until(self, op: str) -> dict[str, Any]:
        while True:
            m = self.read()
            if m["op"] == op:
                return m

    def ping(self, seq: int) -> bool:
        self.send({"op": "ping", "seq": seq})
        pong = self.until("pong")
        assert pong["seq"] == seq
        return bool(pong["ok"])

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def test_a_coordinator_with_spares_grants_leases_only_with_a_majority_and_places_ranks(
    coordinator: tuple[Coordinator, _Source, _Sink],
) -> None:
    c, source, sink = coordinator
    node0 = Peer(c.port, 0, "job-a0-0")
    welcome = node0.until("welcome")
    assert welcome["term"] == 0 and welcome["pod"] == "job-a0-0"
    assert welcome["mac"] == welcome_mac(KEY, node0.challenge, "ab" * 32, 0, "job-a0-0")
    assert node0.ping(1) is False  # 1 of 3 launchers (2 node ranks + 1 spare): no majority
    spare = Peer(c.port, 2, "job-a0-s0", spare=0)
    spare.until("welcome")
    deadline = time.monotonic() + 5
    while not node0.ping(2):  # 2 of 3 from the coordinator's next look on
        assert time.monotonic() < deadline
    node1 = Peer(c.port, 1, "job-a0-1")
    node1.until("welcome")
    roster = node1.until("roster")
    assert roster["term"] == 0 and roster["coordinator"] == "job-a0-0" and roster["node"] == 0
    while [x[0] for x in roster["candidates"]] != ["job-a0-1", "job-a0-s0"]:
        roster = node1.until("roster")  # sent again when it changes: node 1 joins it
        assert time.monotonic() < deadline
    # The lowest node rank next, then the idle spares, each where it would listen.
    assert roster["candidates"][0] == ["job-a0-1", "127.0.0.1", 40001]
    for peer in (node1, spare):
        seq = 1
        while not peer.ping(seq):
            seq += 1
            assert time.monotonic() < deadline
    source.deliver(Decision(0, "Running"))
    starts = {name: p.until("start") for name, p in (("0", node0), ("1", node1))}
    assert {s["node"] for s in starts.values()} == {0, 1}
    assert {s["master"] for s in starts.values()} == {"127.0.0.1"}
    report = next(r for r in reversed(sink.reports) if r.spares)
    assert report.spares == ("job-a0-s0",) and report.quorum is True and report.term == 0
    for p in (node0, node1, spare):
        p.close()


def test_a_spare_that_claims_a_node_rank_or_a_held_pod_is_refused(
    coordinator: tuple[Coordinator, _Source, _Sink],
) -> None:
    c, _, _ = coordinator
    wrong = Peer(c.port, 1, "job-a0-s0", spare=0)  # a spare's node is NNODES + its number
    assert wrong.file.readline() == b""
    first = Peer(c.port, 2, "job-a0-s0", spare=0)
    first.until("welcome")
    twin = Peer(c.port, 2, "job-a0-s0", spare=0)
    assert twin.file.readline() == b""  # that pod is held by an open connection
    for p in (wrong, first, twin):
        p.close()


def test_a_spare_made_again_joins_beside_the_one_that_holds_a_rank(
    coordinator: tuple[Coordinator, _Source, _Sink],
) -> None:
    """Node rank 1 moved onto spare 0 (job-a0-s0); spare 0 is made again (job-a1-s0, the same
    number): both are welcomed, the new one is reported idle, and the old one, reconnecting
    after a drop, still gets in (it holds node rank 1 by its pod's name)."""
    c, source, sink = coordinator
    node0 = Peer(c.port, 0, "job-a0-0")
    held = Peer(c.port, 2, "job-a0-s0", spare=0)
    for p in (node0, held):
        p.until("welcome")
    source.deliver(Decision(1, "Running", ((1, "job-a0-s0"),)))
    new = Peer(c.port, 2, "job-a1-s0", spare=0)
    new.until("welcome")
    deadline = time.monotonic() + 10
    while not any(r.spares == ("job-a1-s0",) for r in sink.reports):
        assert time.monotonic() < deadline, sink.reports[-3:]
        node0.ping(1)  # a majority keeps the reports coming
    held.close()
    again = Peer(c.port, 2, "job-a0-s0", spare=0)
    again.until("welcome")
    for p in (node0, new, again):
        p.close()


def test_a_launcher_gone_right_after_its_messages_leaves_the_coordinator_serving(
    coordinator: tuple[Coordinator, _Source, _Sink],
) -> None:
    """A launcher's hello and pings arrive with its end of stream (it died right after writing
    them): the welcome finds the connection closed, and the messages after the hello are not
    read on a connection already gone (the coordinator's thread died on them once)."""
    c, _, _ = coordinator
    sock = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    file = sock.makefile("rb")
    challenge = json.loads(file.readline())["nonce"]
    hello: dict[str, Any] = {"op": "hello", "node": 1, "pod": "job-a0-1", "epoch": None}
    hello.update(nonce="ab" * 32, spare=None, ip="127.0.0.1", standby=None, term=0)
    hello["mac"] = hello_mac(KEY, challenge, hello)
    pings = [encode({"op": "ping", "seq": i}) for i in (1, 2)]
    sock.sendall(b"".join([encode(hello), *pings]))
    sock.shutdown(socket.SHUT_WR)
    while file.readline():  # until the coordinator closes it
        pass
    file.close()
    sock.close()
    node0 = Peer(c.port, 0, "job-a0-0")
    node0.until("welcome")  # still serving
    assert c.thread.is_alive()
    node0.close()
