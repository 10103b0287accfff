"""A pytest plugin: the run fails if any process it started is still alive when it ends.

How a process counts as started by the run (either is enough):
- it descends from the pytest process. pytest makes itself a child subreaper
  (prctl PR_SET_CHILD_SUBREAPER) when the session starts, so a process whose parent exits is
  re-parented to pytest instead of PID 1 and stays in pytest's tree: a rank's spawned helper, a
  daemon that double-forked, a cluster component started in a new session;
- its environment carries this session's marker (MEGATRON_TEST_SESSION), which every child
  inherits unless a test builds an environment from scratch.

At the end of the session, after every fixture's teardown, whatever is left gets a grace period
(10 s) to exit. What is still alive then is listed (PID, RSS, command line), killed with SIGKILL,
and the session's exit status becomes "tests failed". Leftover zombies (children that exited but
were never waited for) are reaped and not counted.

Used by tests/conftest.py; tests/unit/test_process_check.py shows it catches an orphan.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

MARKER = "MEGATRON_TEST_SESSION"
# How long what is left may take to exit (MEGATRON_LEFTOVER_GRACE_SECONDS; the check's own test
# uses 1 s).
GRACE_SECONDS = float(os.environ.get("MEGATRON_LEFTOVER_GRACE_SECONDS", "10"))
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Leftover:
    pid: int
    rss_mib: int
    cmdline: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.rss_mib} MiB RSS): {self.cmdline[:300]}"


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent PID, state) of a process, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0]


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _describe(pid: int) -> Leftover | None:
    try:
        argv = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
    except OSError:
        return None
    return Leftover(pid, rss, argv.strip() or "?")


def _reap_zombie_children() -> None:
    """Wait for our exited children (orphans re-parented to us are our children now)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def live_processes(root: int, marker: str) -> list[int]:
    """Live (non-zombie) descendants of `root`, plus live processes whose environment holds
    `marker`; never `root` itself."""
    parents: dict[int, int] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[1] not in ("Z", "X"):
            parents[pid] = st[0]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    wanted = marker.encode()
    found |= {pid for pid in parents if pid != root and _has_marker(pid, wanted)}
    found.discard(root)
    return sorted(found)


def leftovers(root: int, marker: str, grace: float) -> list[Leftover]:
    """What is still alive after `grace` seconds; those processes are then SIGKILLed."""
    deadline = time.monotonic() + grace
    while True:
        _reap_zombie_children()
        alive = live_processes(root, marker)
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    described = [d for d in (_describe(pid) for pid in alive) if d is not None]
    for d in described:
        with contextlib.suppress(ProcessLookupError):
            os.kill(d.pid, signal.SIGKILL)
    time.sleep(0.2)
    _reap_zombie_children()
    return described


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _is_xdist_worker(config):
        return  # the controlling process checks the whole tree, workers included
    os.environ.setdefault(MARKER, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")
    config.stash[_subreaper_key] = _become_subreaper()


_subreaper_key = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _is_xdist_worker(config) or MARKER not in os.environ:
        return
    left = leftovers(os.getpid(), os.environ[MARKER], GRACE_SECONDS)
    config.stash[_leftovers_key] = left
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_leftovers_key = pytest.StashKey[list[Leftover]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    left = terminalreporter.config.stash.get(_leftovers_key, [])
    if left:
        terminalreporter.section("processes left behind", red=True)
        terminalreporter.write_line(
            f"{len(left)} process(es) started by this run were still alive "
            f"{GRACE_SECONDS:.0f} s after it ended (now killed); the run fails:"
        )
        for d in left:
            terminalreporter.write_line(f"  {d}")
