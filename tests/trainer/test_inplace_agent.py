"""The InPlace launcher for real: launchers as processes, their coordinator, real rank processes
and signals; the ranks are stand-ins (inplace_stub.py) and the test plays the operator through
the status file, as `mjob run --local` does. No torch: these run in seconds."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.exitcodes import ExitCode
from megatron_contract.ladder import Report, parse_report
from megatron_contract.ports import free_port

STUB = Path(__file__).with_name("inplace_stub.py")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Gang:
    """`nodes` launchers of `nproc` stand-in ranks each, and the status file they follow."""

    def __init__(self, workdir: Path, nodes: int = 2, nproc: int = 2, **extra: str) -> None:
        self.dir = workdir
        self.nodes, self.nproc = nodes, nproc
        self.master_port, self.coordinator_port = free_port(), free_port()
        self.status_file = workdir / "status.json"
        self.report_file = workdir / "report.json"
        self.key_file = workdir / "coordinator.key"
        self.key_file.write_bytes(os.urandom(32))
        self.extra = extra
        self.launchers: dict[int, subprocess.Popen[bytes]] = {}
        self.status(0, "Pending")

    def env(self, node: int, attempt: int = 0, pod: str | None = None) -> dict[str, str]:
        """Node ranks from `nodes` on are spares (with MEGATRON_SPARE_NODES in `extra`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_")}
        if node >= self.nodes:
            env["MEGATRON_SPARE_INDEX"] = str(node - self.nodes)
            pod = pod or f"job-a{attempt}-s{node - self.nodes}"
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(self.master_port),
            WORLD_SIZE=str(self.nodes * self.nproc),
            NNODES=str(self.nodes),
            NODE_RANK=str(node),
            NPROC_PER_NODE=str(self.nproc),
            MEGATRON_CONFIG=str(self.dir / "unused.json"),
            MEGATRON_RESTART_ATTEMPT=str(attempt),
            MEGATRON_RESTART_STRATEGY="InPlace",
            MEGATRON_COORDINATOR_PORT=str(self.coordinator_port),
            MEGATRON_COORDINATOR_KEY_FILE=str(self.key_file),
            MEGATRON_STATUS_FILE=str(self.status_file),
            MEGATRON_REPORT_FILE=str(self.report_file),
            POD_NAME=pod or f"job-a{attempt}-{node}",
            **self.extra,
        )
        return env

    def launch(self, node: int, attempt: int = 0, pod: str | None = None, **env: str) -> None:
        with (self.dir / f"launcher-{node}-{attempt}.log").open("ab") as log:
            self.launchers[node] = subprocess.Popen(
                [sys.executable, str(STUB), "launcher", str(self.dir)],
                env={**self.env(node, attempt, pod), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def status(self, attempt: int, phase: str, swaps: dict[int, str] | None = None) -> None:
        doc: dict[str, Any] = {"restartAttempt": attempt, "phase": phase}
        if swaps:
            doc["swaps"] = {str(r): p for r, p in swaps.items()}
        tmp = self.status_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.status_file)

    def ranks(self, attempt: int | None = None) -> list[dict[str, Any]]:
        path = self.dir / "ranks.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in rows if attempt is None or r["attempt"] == attempt]

    def started(self, attempt: int) -> list[dict[str, Any]]:
        return wait(
            lambda: rows if len(rows := self.ranks(attempt)) == self.nodes * self.nproc else None,
            f"every rank of attempt {attempt}",
        )

    def report(self) -> Report | None:
        try:
            return parse_report(self.report_file.read_text())
        except OSError:
            return None

    def finish(self, attempt: int, code: int = 0, ranks: list[int] | None = None) -> None:
        for r in ranks if ranks is not None else range(self.nodes * self.nproc):
            (self.dir / f"exit-{attempt}-{r}").write_text(str(code))

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.dir.glob("launcher-*.log")))

    def stop(self) -> None:
        for proc in self.launchers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def gang(tmp_path: Path) -> Iterator[Gang]:
    g = Gang(tmp_path)
    try:
        yield g
    finally:
        g.stop()


def test_ranks_start_behind_the_barrier_and_restart_in_place_on_the_decision(gang: Gang) -> None:
    gang.launch(1)
    time.sleep(0.5)
    assert gang.ranks() == []  # the barrier: node rank 0 (the coordinator) is not up yet
    gang.launch(0)
    first = gang.started(0)
    assert {r["port"] for r in first} == {gang.master_port}
    pids = {r["rank"]: r["pid"] for r in first}
    launchers = {n: p.pid for n, p in gang.launchers.items()}

    os.kill(pids[3], signal.SIGKILL)  # a rank process dies inside a running "pod"
    report = wait(lambda: r if (r := gang.report()) and r.failures else None, "the report")
    assert report.attempt == 0
    assert [(f.node_rank, f.local_rank, f.exit_code) for f in report.failures] == [(1, 1, 137)]
    wait(lambda: not alive(pids[2]), "rank 2 (same pod) to be stopped by its launcher")
    assert alive(pids[0]) and alive(pids[1])  # the other pod waits for the decision

    gang.status(1, "Restarting")  # the decision: attempt 1, not released yet (the backoff)
    wait(lambda: not alive(pids[0]) and not alive(pids[1]), "the older attempt to stop")
    time.sleep(0.3)
    assert gang.ranks(1) == []
    gang.status(1, "Running")  # the release
    second = gang.started(1)
    ports = {r["port"] for r in second}
    assert len(ports) == 1 and ports != {gang.master_port}  # a fresh rendezvous port
    report = wait(lambda: r if (r := gang.report()) and r.started == 2 else None, "started")
    assert report.attempt == 1 and report.failures == () and report.started_at and report.seen_at
    # The same launcher processes ("pods") run attempt 1.
    assert {n: p.pid for n, p in gang.launchers.items()} == launchers
    assert all(p.poll() is None for p in gang.launchers.values())

    gang.finish(1, ranks=[2, 3])  # node rank 1 finishes first: it leaves, it is not lost
    assert gang.launchers[1].wait(timeout=20) == 0, gang.logs()
    time.sleep(0.3)
    report = gang.report()
    assert report is not None and report.lost == ()
    gang.finish(1, ranks=[0, 1])
    assert gang.launchers[0].wait(timeout=20) == 0, gang.logs()
    assert not [r for r in gang.ranks() if alive(r["pid"])]


def test_a_lost_launcher_is_reported_and_its_replacement_joins_the_barrier(gang: Gang) -> None:
    gang.launch(0)
    gang.launch(1)
    first = {r["rank"]: r["pid"] for r in gang.started(0)}
    gang.launchers[1].kill()  # the container of "pod" 1 dies
    gang.launchers[1].wait()
    report = wait(lambda: r if (r := gang.report()) and r.lost else None, "the lost launcher")
    assert [(x.node_rank, x.pod) for x in report.lost] == [(1, "job-a0-1")]
    wait(lambda: not alive(first[2]) and not alive(first[3]), "pod 1's ranks to die with it")

    gang.status(1, "Restarting")
    wait(lambda: not alive(first[0]) and not alive(first[1]), "pod 0's ranks to stop")
    gang.status(1, "Running")  # released before the replacement is up: the barrier holds
    time.sleep(0.3)
    assert gang.ranks(1) == []
    gang.launch(1, attempt=1)  # the replacement pod, job-a1-1
    gang.started(1)
    report = wait(lambda: r if (r := gang.report()) and r.started == 2 else None, "started")
    assert report.lost == ()
    gang.finish(1)
    assert {n: p.wait(timeout=20) for n, p in gang.launchers.items()} == {0: 0, 1: 0}


def test_sigterm_reaches_the_ranks_and_the_launcher_exits_143(gang: Gang) -> None:
    gang.launch(0)
    gang.launch(1)
    ranks = gang.started(0)
    for proc in gang.launchers.values():
        proc.send_signal(signal.SIGTERM)
    codes = {n: p.wait(timeout=20) for n, p in gang.launchers.items()}
    assert codes == {0: ExitCode.SIGTERM, 1: ExitCode.SIGTERM}
    assert not [r for r in ranks if alive(r["pid"])]


def test_without_the_coordinator_healthy_ranks_run_on_and_a_failed_one_ends_the_pod(
    tmp_path: Path,
) -> None:
    gang = Gang(tmp_path, STUB_RECONNECT_GRACE="1")
    try:
        gang.launch(0)
        gang.launch(1)
        pids = {r["rank"]: r["pid"] for r in gang.started(0)}
        gang.launchers[0].kill()  # the coordinator's pod is gone
        gang.launchers[0].wait()
        time.sleep(1.5)
        assert gang.launchers[1].poll() is None and alive(pids[2]) and alive(pids[3])
        gang.finish(0, code=5, ranks=[2])
        assert gang.launchers[1].wait(timeout=20) == 5, gang.logs()
        assert "cannot report the failed rank to the coordinator" in gang.logs()
    finally:
        gang.stop()


def test_no_decision_in_time_ends_the_pod_with_the_ranks_code(tmp_path: Path) -> None:
    gang = Gang(tmp_path, nodes=1)
    try:
        gang.launch(0, STUB_DECISION_TIMEOUT="1")
        gang.started(0)
        gang.finish(0, code=9, ranks=[0])
        assert gang.launchers[0].wait(timeout=20) == 9, gang.logs()
        assert "no decision" in gang.logs()
    finally:
        gang.stop()


def test_a_decision_in_time_holds_the_launchers_through_a_longer_backoff(tmp_path: Path) -> None:
    """The launchers whose ranks failed (the killed one's, and the other pod's whose ranks lost
    their peer) hear the decision, and wait for the release past their decision timeout."""
    gang = Gang(tmp_path)
    try:
        for node in (0, 1):
            gang.launch(node, STUB_DECISION_TIMEOUT="1")
        pids = {r["rank"]: r["pid"] for r in gang.started(0)}
        gang.finish(0, code=9, ranks=[3])
        gang.finish(0, code=1, ranks=[0])  # a rank of the other pod, its peer gone
        wait(lambda: r if (r := gang.report()) and len(r.failures) == 2 else None, "the report")
        gang.status(1, "Restarting")  # decided; the backoff outlasts the decision timeout
        wait(lambda: not any(alive(p) for p in pids.values()), "attempt 0 to stop")
        time.sleep(2.5)
        assert all(p.poll() is None for p in gang.launchers.values()), gang.logs()
        gang.status(1, "Running")
        gang.started(1)
        gang.finish(1)
        assert {n: p.wait(timeout=20) for n, p in gang.launchers.items()} == {0: 0, 1: 0}
        assert "no decision" not in gang.logs()
    finally:
        gang.stop()


def test_a_coordinator_that_hears_no_operator_lets_a_failed_rank_end_its_pod(
    tmp_path: Path,
) -> None:
    """No status file and no apiserver: the ranks still start behind the barrier, and a failure
    ends the pod at once, as a plain launcher's would."""
    gang = Gang(tmp_path, nodes=1)
    try:
        gang.launch(0, MEGATRON_STATUS_FILE="")
        gang.started(0)
        gang.finish(0, code=3, ranks=[1])
        try:
            code = gang.launchers[0].wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the launcher did not end: {gang.ranks()}\n{gang.logs()}"
            ) from None
        assert code == 3, gang.logs()
        assert "a failed rank will end its pod" in gang.logs()
    finally:
        gang.stop()


def _peer(gang: Gang) -> tuple[socket.socket, str]:
    """A connection to the gang's coordinator, and the nonce of its challenge."""
    sock = socket.create_connection(("127.0.0.1", gang.coordinator_port), timeout=5)
    line = sock.makefile("rb").readline()
    challenge = json.loads(line)
    assert challenge["op"] == "challenge" and len(challenge["nonce"]) == 64
    return sock, str(challenge["nonce"])


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True
            if b'"op":"welcome"' in chunk:
                return False
    except ConnectionResetError:
        return True


def test_the_coordinator_drops_what_is_not_the_protocol(gang: Gang) -> None:
    gang.launch(0)
    gang.launch(1)
    gang.started(0)
    for junk in (b"not json\n", b'{"op":"failed"}\n', b"x" * 10000, b'{"op":"hello","node":99}\n'):
        s, _ = _peer(gang)
        with s:
            s.sendall(junk)
            assert _closed(s)  # closed on us
    assert all(p.poll() is None for p in gang.launchers.values())
    report = gang.report()
    assert report is None or (report.failures == () and report.lost == ())


KILL_SCRIPT = r"""
import json, os, sys, time
from pathlib import Path
from megatron_trainer.agent.procs import become_subreaper, descendants
from megatron_trainer.agent.ranks import RankProcesses

ready = Path(sys.argv[1])
become_subreaper()  # as the launcher: an orphaned helper is re-parented to this process
# A rank that forks a helper holding 256 MiB (as an async checkpoint writer holds its buffers):
# a killed process frees its memory while it exits, after its parent may already be gone.
rank = [sys.executable, "-c", (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    held = bytearray(256 << 20)\n"
    "    for i in range(0, len(held), 4096): held[i] = 1\n"
    "    open(sys.argv[1], 'w').close()\n"
    "time.sleep(600)\n"
), str(ready)]
ranks = RankProcesses(1, rank, lambda local, attempt, port: dict(os.environ))
ranks.start(0, 0)
while not ready.exists():
    time.sleep(0.01)
ranks.kill()
print(json.dumps(descendants(os.getpid())))
"""


def test_the_next_attempt_waits_for_every_descendant_of_the_old_one(tmp_path: Path) -> None:
    """RankProcesses.kill returns (and the agent releases the next attempt) only once the ranks
    and everything they started have exited, not once the ranks alone are reaped."""
    out = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "helper-ready")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_zygote_whose_imports_started_cuda_forks_no_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CUDA driver started in the zygote is unusable in the ranks it would fork (and a context
    it made would sit on GPU 0 beside rank 0's): it forks none, and the launcher starts the ranks
    on their own (test_zygote.py). The driver's own record is not reachable here (no GPU, no
    libcuda): torch's stands in for it."""
    import types

    from megatron_trainer import worker

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert worker.fork_unsafe() == "the imports initialised CUDA (torch)"


def _forge(gang: Gang, node: int, key: bytes) -> socket.socket:
    """A peer posing as `node`'s launcher: its hello (with a MAC under `key`), then a failure
    with exit code 78 (the trainer's configuration error, which the default rules fail the job
    on) and a drop. Returns the socket, closed or not by the coordinator."""
    from megatron_trainer.agent.wire import encode, hello_mac

    sock, challenge = _peer(gang)
    hello = {"op": "hello", "node": node, "pod": f"job-a0-{node}", "epoch": 0, "nonce": "ab" * 32}
    hello["mac"] = hello_mac(key, challenge, hello)
    failed = {"op": "failed", "epoch": 0, "local": 0, "code": 78, "time": "2026-01-01T00:00:00Z"}
    with contextlib.suppress(OSError):
        sock.sendall(encode(hello) + encode(failed))
    return sock


def test_a_peer_without_the_key_changes_nothing(gang: Gang) -> None:
    gang.launch(0)
    gang.launch(1)
    first = {r["rank"]: r["pid"] for r in gang.started(0)}
    # A guessed key, and a replay of a real launcher's hello under a guessed nonce: both refused.
    for key in (b"0" * 32, b"guess"):
        with _forge(gang, 1, key) as sock:
            assert _closed(sock)
    time.sleep(0.5)
    report = gang.report()
    assert report is None or (report.failures == () and report.lost == ()), report
    assert all(alive(p) for p in first.values())  # no rank was stopped
    assert all(p.poll() is None for p in gang.launchers.values())
    assert gang.logs().count("a hello as node rank 1 without the job's key") == 2
    for _ in range(20):  # a peer reconnecting in a loop does not flood the pod's log
        with _forge(gang, 1, b"0" * 32) as sock:
            assert _closed(sock)
    assert gang.logs().count("coordinator: dropping a connection") == 5
    gang.finish(0)
    assert {n: p.wait(timeout=20) for n, p in gang.launchers.items()} == {0: 0, 1: 0}


def test_a_second_hello_for_a_live_node_rank_is_refused(gang: Gang) -> None:
    # Even with the key (a leaked key, or a launcher of the job started twice): the node rank's
    # open connection keeps its place, and nothing the second one says counts.
    gang.launch(0)
    gang.launch(1)
    gang.started(0)
    with _forge(gang, 1, gang.key_file.read_bytes()) as sock:
        assert _closed(sock)
    time.sleep(0.5)
    report = gang.report()
    assert report is None or (report.failures == () and report.lost == ()), report
    gang.finish(0)
    assert {n: p.wait(timeout=20) for n, p in gang.launchers.items()} == {0: 0, 1: 0}


def test_idle_connections_up_to_the_cap_do_not_keep_launchers_out(tmp_path: Path) -> None:
    from megatron_trainer.agent.wire import HELLO_TIMEOUT_SECONDS, MAX_PENDING

    gang = Gang(tmp_path)
    idle: list[socket.socket] = []
    try:
        gang.launch(0)
        wait(lambda: _connectable(gang), "the coordinator to listen")
        # Twice the cap of connections that never say hello, held open, before the other
        # launcher starts: the oldest are dropped to make room, and each is closed after the
        # hello deadline anyway.
        idle = [_peer(gang)[0] for _ in range(2 * MAX_PENDING)]
        gang.launch(1)
        gang.started(0)  # the barrier passed
        start = time.monotonic()
        assert all(_closed(s) for s in idle)
        assert time.monotonic() - start < HELLO_TIMEOUT_SECONDS + 5
        gang.finish(0)
        assert {n: p.wait(timeout=20) for n, p in gang.launchers.items()} == {0: 0, 1: 0}
    finally:
        for s in idle:
            s.close()
        gang.stop()


def _connectable(gang: Gang) -> bool:
    try:
        socket.create_connection(("127.0.0.1", gang.coordinator_port), timeout=1).close()
    except OSError:
        return False
    return True


def test_a_launcher_without_the_key_never_starts_its_ranks(tmp_path: Path) -> None:
    gang = Gang(tmp_path)
    try:
        gang.launch(0)
        other = tmp_path / "other.key"
        other.write_bytes(os.urandom(32))
        gang.launch(1, MEGATRON_COORDINATOR_KEY_FILE=str(other))
        # The coordinator refuses its hello (the MAC is under another key), again and again.
        wait(
            lambda: gang.logs().count("a hello as node rank 1 without the job's key") >= 3,
            "the coordinator to refuse node rank 1 three times",
        )
        assert gang.ranks() == []  # node rank 1 never joined: the barrier holds
        assert all(p.poll() is None for p in gang.launchers.values())
    finally:
        gang.stop()


def test_where_the_coordinator_listens_and_whether_the_key_is_usable(tmp_path: Path) -> None:
    from dataclasses import replace

    from megatron_contract.env import runtime_env
    from megatron_trainer.agent.inplace import listen_address, usable_key

    gang = Gang(tmp_path)
    env = runtime_env(gang.env(0))
    assert listen_address(env) == "127.0.0.1"  # locally: loopback
    pod = replace(env, master_addr="job-0.job.team.svc", pod_ip="10.1.2.3")
    assert listen_address(pod) == "10.1.2.3"  # the pod's own IP: not a secondary network's
    assert listen_address(replace(pod, pod_ip=None)) == ""  # unknown: every interface
    assert usable_key(env) is None
    # Without a key (an operator that mounts none, a Secret deleted by hand) the pod runs
    # as with Recreate (launcher.py): no coordinator may listen unauthenticated.
    assert "no coordinator key file" in str(usable_key(replace(env, coordinator_key_file=None)))
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    assert "not a key" in str(usable_key(replace(env, coordinator_key_file=str(short))))
    missing = str(tmp_path / "none.key")
    assert "cannot be read" in str(usable_key(replace(env, coordinator_key_file=missing)))
