"""Spare nodes and fencing for real: launcher processes with real (stand-in) rank processes, the
coordinator, and a network cut between a launcher and its coordinator, made by a relay that
stops passing bytes without closing anything (as a cut link does). The test plays the operator
through the status file. What it checks is read from the processes themselves: at every moment
(sampled every 10 ms), no global rank has two live processes.

A run takes ~10-20 s: the fence and the swap wait are seconds by design (liveness.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.exitcodes import ExitCode
from megatron_contract.ladder import Report
from megatron_contract.ports import free_port

from .test_inplace_agent import Gang, alive, wait

NODES, NPROC = 2, 2
SPARE = NODES  # the spare's node index (NNODES + 0)


class Relay:
    """TCP from `port` to `target`; `cut()` makes it a black hole (nothing passes, nothing is
    closed, new connections are refused), `heal()` lets new connections through again."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.open = True
        self.socks: list[socket.socket] = []
        self.listener = self._listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _listen(self) -> socket.socket:
        sock = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return sock

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                if not self.open:
                    time.sleep(0.05)
                    continue
                return
            if not self.open:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                client.close()
                continue
            self.socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if not self.open:
                    return  # dropped, and nothing read any more: the sender's buffers fill
                b.sendall(data)
        if self.open:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        self.open = False
        with contextlib.suppress(OSError):
            self.listener.close()

    def heal(self) -> None:
        self.open = True
        self.listener = self._listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.open = False
        for s in [self.listener, *self.socks]:
            with contextlib.suppress(OSError):
                s.close()


class Watch:
    """Samples the live rank processes every 10 ms (from the pids the ranks recorded) and keeps
    every moment two of them held one global rank."""

    def __init__(self, gang: Gang) -> None:
        self.gang = gang
        self.doubles: list[dict[int, list[dict[str, Any]]]] = []
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(0.01):
            live: dict[int, list[dict[str, Any]]] = {}
            for r in self.gang.ranks():
                if alive(r["pid"]):
                    live.setdefault(r["rank"], []).append(r)
            self.samples += 1
            double = {k: v for k, v in live.items() if len(v) > 1}
            if double:
                self.doubles.append(double)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)


@pytest.fixture
def spared(tmp_path: Path) -> Iterator[Gang]:
    g = Gang(tmp_path, nodes=NODES, nproc=NPROC, MEGATRON_SPARE_NODES="1")
    try:
        yield g
    finally:
        g.stop()


def _report(gang: Gang, check: Any, what: str) -> Report:
    return wait(lambda: r if (r := gang.report()) is not None and check(r) else None, what, 30)


def _pods_of(gang: Gang, attempt: int) -> dict[int, str]:
    return {r["rank"]: r["pod"] for r in gang.started(attempt)}


def test_a_cut_off_node_fences_before_its_rank_runs_on_the_spare(spared: Gang) -> None:
    gang = spared
    relay = Relay(gang.coordinator_port)
    watch = Watch(gang)
    try:
        gang.launch(0)
        gang.launch(1, MEGATRON_COORDINATOR_PORT=str(relay.port))  # node 1 dials through it
        gang.launch(SPARE)
        gang.status(0, "Running")
        assert _pods_of(gang, 0) == {0: "job-a0-0", 1: "job-a0-0", 2: "job-a0-1", 3: "job-a0-1"}
        report = _report(gang, lambda r: r.spares == ("job-a0-s0",), "the spare ready")
        assert report.quorum is True and report.coordinator == "job-a0-0"
        old = {r["rank"]: r["pid"] for r in gang.ranks(0)}

        relay.cut()  # node 1 is cut off; its launcher and ranks live on
        cut = time.monotonic()
        report = _report(gang, lambda r: [x.pod for x in r.lost] == ["job-a0-1"], "the loss")
        lost_after = time.monotonic() - cut
        assert report.quorum is True  # node 0 and the spare: 2 of 3
        # The operator's decision: node rank 1 onto the spare; released after its backoff.
        gang.status(1, "Restarting", swaps={1: "job-a0-s0"})
        wait(lambda: not alive(old[0]) and not alive(old[1]), "node 0's ranks to stop")
        gang.status(1, "Running", swaps={1: "job-a0-s0"})
        pods = _pods_of(gang, 1)
        started = time.monotonic() - cut
        assert pods == {0: "job-a0-0", 1: "job-a0-0", 2: "job-a0-s0", 3: "job-a0-s0"}
        # The cut-off node killed its ranks itself, before the spare started theirs.
        assert not alive(old[2]) and not alive(old[3])
        fenced = "killed the ranks of attempt 0 (fenced)"
        assert fenced in (gang.dir / "launcher-1-0.log").read_text()
        assert {r["master"] for r in gang.ranks(1)} == {"127.0.0.1"}

        relay.heal()  # node 1 comes back: its node rank is the spare's now, so it leaves
        assert gang.launchers[1].wait(timeout=30) == ExitCode.SIGTERM, gang.logs()
        assert "place moved to another pod: leaving" in gang.logs()
    finally:
        watch.stop()
        relay.close()
    assert watch.samples > 100
    assert watch.doubles == [], watch.doubles[:3]
    print(f"cut → lost {lost_after:.1f} s, cut → attempt 1 started on the spare {started:.1f} s")
    gang.finish(1)
    assert gang.launchers[0].wait(timeout=20) == 0
    assert gang.launchers[SPARE].wait(timeout=20) == 0


def test_the_coordinators_node_cut_off_hands_over_and_rank_0_moves_to_the_spare(
    spared: Gang,
) -> None:
    """Node 0 (the coordinator's pod) is cut off from the others, its processes alive and its
    coordinator still reading the decisions: node 1's launcher takes over (term 1), reports node
    0 lost with a majority, and attempt 1 runs node rank 0 on the spare and node rank 1 where it
    was, with the spare as the rendezvous host; node 0 fences, then leaves."""
    gang = spared
    to_node1 = Relay(gang.coordinator_port)
    to_spare = Relay(gang.coordinator_port)
    watch = Watch(gang)
    try:
        gang.launch(0)
        gang.launch(1, MEGATRON_COORDINATOR_PORT=str(to_node1.port))
        gang.launch(SPARE, MEGATRON_COORDINATOR_PORT=str(to_spare.port))
        gang.status(0, "Running")
        gang.started(0)
        _report(gang, lambda r: r.spares == ("job-a0-s0",), "the spare ready")
        old = {r["rank"]: r["pid"] for r in gang.ranks(0)}

        to_node1.cut()
        to_spare.cut()  # node 0 is alone: its coordinator no longer hears a majority
        cut = time.monotonic()
        report = _report(
            gang,
            lambda r: r.term == 1 and [x.pod for x in r.lost] == ["job-a0-0"],
            "the successor's report of node 0 lost",
        )
        took_over = time.monotonic() - cut
        assert report.coordinator == "job-a0-1" and report.quorum is True
        assert report.lost[0].node_rank == 0
        gang.status(1, "Restarting", swaps={0: "job-a0-s0"})
        gang.status(1, "Running", swaps={0: "job-a0-s0"})
        pods = _pods_of(gang, 1)
        started = time.monotonic() - cut
        assert pods == {0: "job-a0-s0", 1: "job-a0-s0", 2: "job-a0-1", 3: "job-a0-1"}
        assert not any(alive(pid) for pid in old.values())
        # Node 0's ranks ended by its lease (fenced) or, its coordinator still reading the
        # decisions here, by attempt 1's decision, whichever came first; either way before the
        # spare's (the watch). Its pod's place is the spare's now: it leaves.
        said = (gang.dir / "launcher-0-0.log").read_text()
        assert "(fenced)" in said or "stopped the ranks of attempt 0" in said, said
        assert gang.launchers[0].wait(timeout=30) == ExitCode.SIGTERM, gang.logs()
    finally:
        watch.stop()
        to_node1.close()
        to_spare.close()
    assert watch.samples > 100
    assert watch.doubles == [], watch.doubles[:3]
    print(f"cut → successor's report {took_over:.1f} s, → attempt 1 started {started:.1f} s")
    gang.finish(1)
    assert gang.launchers[1].wait(timeout=20) == 0
    assert gang.launchers[SPARE].wait(timeout=20) == 0
