"""`--inject-failure STEP[:RANK[:SIGNAL]]`: kill a rank when it first reaches a step;
`STEP:podN`: kill the whole pod of node rank N (its process group, as a lost node)."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

from megatron_contract.procname import rank_of_comm
from megatron_operator.api.errors import FieldError, SpecError


@dataclass
class Injection:
    step: int
    rank: int = 0
    signal: int = signal.SIGKILL
    fired: bool = False
    fired_at: float | None = None  # Unix time the signal was sent
    # Unix time the rank's process was gone (the true failure time: a rank in the middle of a
    # write can outlive its SIGKILL by seconds), once seen; polled from a thread.
    died_at: float | None = None
    pod: int | None = None  # the node rank whose whole pod is killed (`STEP:podN`)

    def describe(self) -> str:
        if self.pod is not None:
            return f"SIGKILL to the pod of node rank {self.pod} at step {self.step}"
        return f"{signal.Signals(self.signal).name} to rank {self.rank} at step {self.step}"


def _signal(text: str) -> int:
    name = text.upper()
    if name.isascii() and name.isdigit() and len(name) <= 3:
        return signal.Signals(int(name)).value
    if not name.startswith("SIG"):
        name = "SIG" + name
    return signal.Signals[name].value


def parse_injection(text: str) -> Injection:
    """Parse one STEP[:RANK[:SIGNAL]]; SIGNAL is a name (KILL, SIGTERM) or a number."""
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 3:
            raise ValueError
        if len(parts) == 2 and parts[1].startswith("pod"):
            step, pod = int(parts[0]), int(parts[1][3:])
            if step < 1 or pod < 0:
                raise ValueError
            return Injection(step, 0, signal.SIGKILL, pod=pod)
        step = int(parts[0])
        rank = int(parts[1]) if len(parts) > 1 and parts[1] else 0
        sig = _signal(parts[2]) if len(parts) > 2 else signal.SIGKILL
        if step < 1 or rank < 0:
            raise ValueError
    except (ValueError, KeyError):
        raise SpecError(
            [
                FieldError(
                    "--inject-failure",
                    f"{text!r} is not STEP[:RANK[:SIGNAL]] with STEP ≥ 1, RANK ≥ 0 and a signal "
                    "such as KILL or TERM (e.g. 20, 20:1, 20:1:TERM), nor STEP:podN (the pod of "
                    "node rank N, e.g. 20:pod1)",
                )
            ]
        ) from None
    return Injection(step, rank, sig)


def check_ranks(injections: list[Injection], world_size: int, nodes: int | None = None) -> None:
    errors = [
        FieldError("--inject-failure", f"rank {i.rank} does not exist (world size {world_size})")
        for i in injections
        if i.rank >= world_size
    ]
    errors += [
        FieldError("--inject-failure", f"pod {i.pod} does not exist ({nodes} node(s))")
        for i in injections
        if i.pod is not None and nodes is not None and i.pod >= nodes
    ]
    if errors:
        raise SpecError(errors)


def due(
    injections: list[Injection], step: int, attempt: int, injected_attempt: int
) -> list[Injection]:
    """The injections to fire on a report of `step` by `attempt`: those of the lowest step
    reached and not fired yet (two ranks killed at one step fire together), and none in an attempt
    already failed by one (`injected_attempt`). Reports are read in batches: a late batch (steps 5
    and 6 read together) would otherwise kill the gang twice in one attempt, which is one failure,
    not two. A later step's injections wait for a report of a later attempt."""
    if attempt <= injected_attempt:
        return []
    reached = [i for i in injections if not i.fired and step >= i.step]
    first = min((i.step for i in reached), default=None)
    return [i for i in reached if i.step == first]


def rank_pids(roots: list[int]) -> dict[int, int]:
    """Global rank → PID of the rank processes under these pod processes: a rank forked by its
    pod's zygote (named by its command name, megatron_contract/procname.py), a built-in worker
    started on its own, or a trainer.command (the launcher's own children) (RANK in their
    environment)."""
    import psutil

    found: dict[int, int] = {}
    for root in roots:
        try:
            children = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                forked = rank_of_comm(child.name())
                if forked is not None:
                    # Its own forks (a sync save's writers) carry the name too, one level down.
                    if child.ppid() == root:
                        found.setdefault(forked, child.pid)
                    continue
                cmd = child.cmdline()
                rank = child.environ().get("RANK")
                parent = child.ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            worker = any("megatron_trainer.worker" in c for c in cmd)
            if (
                rank is not None
                and rank.isascii()
                and rank.isdigit()
                and (worker or parent == root)
                and "--zygote" not in cmd
            ):
                found.setdefault(int(rank), child.pid)
    return found


def fire(injection: Injection, roots: list[int]) -> bool:
    """Send the signal to the rank's process. False if that rank is not running (yet)."""
    pid = rank_pids(roots).get(injection.rank)
    if pid is None:
        return False
    try:
        os.kill(pid, injection.signal)
    except ProcessLookupError:
        return False
    injection.fired = True
    injection.fired_at = time.time()
    threading.Thread(target=_watch, args=(injection, pid), daemon=True).start()
    return True


def _watch(injection: Injection, pid: int, timeout: float = 600.0) -> None:
    """Record when the signalled rank's process is gone (psutil polls a process that is not
    our child every few milliseconds)."""
    import psutil

    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return
    injection.died_at = time.time()
