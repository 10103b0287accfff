"""The pod's rank processes: start, signal, reap, and kill every descendant.

What a rank runs (its command and environment) is the caller's; this module only manages the
processes. The launcher is a child subreaper, so a helper a rank forked (Megatron-Core's
checkpoint writer, a data loader) is re-parented to it when the rank dies, and `kill` takes it
too: no process of an old attempt outlives its attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from .procs import _die_with_parent, descendants, send, wait_code
from .zygote import Zygote


class Ranks(Protocol):
    """The ranks of one pod, one attempt at a time (`StubRanks` in benchmarks/ stands in)."""

    @property
    def running(self) -> bool:
        """Some rank of the current attempt has not been reaped yet."""
        ...

    def start(self, attempt: int, port: int) -> None:
        """Start every local rank of `attempt`, whose rendezvous is on `port`."""
        ...

    def reap(self) -> list[tuple[int, int]]:
        """(local rank, exit code) of the ranks that ended since the last call; never blocks."""
        ...

    def signal(self, sig: int) -> None:
        """Send `sig` to every live rank."""
        ...

    def kill(self) -> None:
        """SIGKILL every rank and everything they started; return once the ranks are reaped."""
        ...


if TYPE_CHECKING:  # aliases for annotations only: `X[...]` of a builtin needs 3.9 at run time
    from .output import RankOutput

    EnvFor = Callable[[int, int, int], Mapping[str, str]]  # (local rank, attempt, port) → env
    Wrap = Callable[[int, int, list[str]], list[str]]  # (local rank, attempt, command) → command
    # A rank's argv: fixed, or from its env (a trainer.command's $(VAR) expanded per rank).
    Command = Sequence[str] | Callable[[Mapping[str, str]], list[str]]


class Forked:
    """A rank forked by the zygote: a PID the launcher reaps (the Popen of a forked process)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


class RankProcesses:
    """`nproc` processes running `command`, each with `env_for(local rank, attempt, port)`.

    With a `zygote` command, the ranks are forked by the pod's zygote (zygote.py), which imports
    what a rank needs once and forks the ranks of every attempt; a rank it cannot fork (the
    zygote is still importing past its timeout, found its imports unsafe to fork, or died)
    starts as its own process, as every rank does without one."""

    KILL_WAIT_SECONDS = 30.0  # a process in uninterruptible sleep (a hung NFS write) may linger

    def __init__(
        self,
        nproc: int,
        command: Command,
        env_for: EnvFor,
        zygote: Sequence[str] | None = None,
        wrap: Wrap | None = None,
        cold: set[int] | None = None,
        output: RankOutput | None = None,
    ) -> None:
        self.nproc = nproc
        self.command = command if callable(command) else list(command)
        self.output = output  # a trainer.command's output is read on its way to the log
        self.env_for = env_for
        self.zygote_command = list(zygote) if zygote else None
        self.zygote: Zygote | None = None
        self.wrap = wrap  # a rank's command, e.g. under a profiler, per attempt
        self.cold = cold or set()  # local ranks that never start from the zygote
        self.warm = 0  # ranks the last start forked from the zygote
        # pid → (local rank, process), for the ranks not reaped yet. The Popen objects are kept:
        # one dropped unreaped would be reaped by subprocess's own cleanup, hiding its exit code.
        self.procs: dict[int, tuple[int, subprocess.Popen[bytes] | Forked]] = {}
        # A forked rank is the launcher's child from the moment its middle process exits, which
        # can be before its PID is known here: what `reap` found of unknown PIDs, kept for that.
        self.unclaimed: dict[int, int] = {}
        self.ended: list[tuple[int, int]] = []
        # With spare nodes, the coordinator says per attempt which node rank this pod runs and
        # where the rendezvous is (node rank 0's pod): they override the pod's own env.
        self.node: int | None = None
        self.master: str | None = None

    def place(self, node: int | None, master: str | None) -> None:
        """The node rank and rendezvous host of the next `start` (None: the pod's own env)."""
        self.node, self.master = node, master

    def _placed(self, local: int, env: dict[str, str]) -> dict[str, str]:
        if self.node is not None:
            env.update(
                RANK=str(self.node * self.nproc + local),
                GROUP_RANK=str(self.node),
                NODE_RANK=str(self.node),
            )
            env.pop("MEGATRON_SPARE_INDEX", None)  # a rank, now: never a spare's
        if self.master:
            env["MASTER_ADDR"] = self.master
        return env

    @property
    def running(self) -> bool:
        return bool(self.procs)

    def prepare(self, attempt: int, port: int) -> None:
        """Start the zygote now (it imports while the launcher waits for its first start)."""
        if self.zygote_command is not None and self.zygote is None and len(self.cold) < self.nproc:
            self.zygote = Zygote(self.zygote_command, self.env_for(0, attempt, port))

    def ready(self) -> bool:
        """Whether `start` would not wait for the zygote's imports (it looks, never waits)."""
        z = self.zygote
        if z is None or len(self.cold) >= self.nproc:
            return True
        return z.poll_ready()

    def start(self, attempt: int, port: int) -> None:
        self.warm = 0
        self.prepare(attempt, port)
        for local in range(self.nproc):
            env = self._placed(local, dict(self.env_for(local, attempt, port)))
            pid = None
            if local not in self.cold and self.zygote is not None and self.zygote.usable:
                pid = self.zygote.fork(env)
            if pid is not None:
                self.warm += 1
                self._claim(local, Forked(pid))
                continue
            argv = self.command(env) if callable(self.command) else self.command
            command = self.wrap(local, attempt, argv) if self.wrap else argv
            proc = subprocess.Popen(
                command,
                env=env,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a pre-resolved prctl
                stdout=subprocess.PIPE if self.output is not None else None,
                stderr=subprocess.PIPE if self.output is not None else None,
            )
            if self.output is not None:
                self.output.attach(local, proc)
            self.procs[proc.pid] = (local, proc)

    def _claim(self, local: int, proc: Forked) -> None:
        code = self.unclaimed.pop(proc.pid, None)
        if code is None:
            self.procs[proc.pid] = (local, proc)
        else:  # it ended before its PID came back from the zygote
            proc.returncode = code
            self.ended.append((local, code))

    def close(self) -> None:
        """Stop the zygote (the launcher is done)."""
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None

    def reap(self) -> list[tuple[int, int]]:
        ended, self.ended = self.ended, []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = wait_code(status)
            entry = self.procs.pop(pid, None)
            if entry is None:
                if self.zygote is not None and pid == self.zygote.pid:
                    self.zygote.proc = None  # reaped here; later ranks start on their own
                    self.zygote.close()
                else:  # an orphan adopted as subreaper, or a forked rank not claimed yet
                    self.unclaimed[pid] = code
                continue
            local, proc = entry
            proc.returncode = code  # reaped here: Popen must not wait for it again
            ended.append((local, code))
        return ended

    def signal(self, sig: int) -> None:
        for pid in self.procs:
            send(pid, sig)

    def kill(self) -> None:
        """SIGKILL every rank and every other descendant (the zygote aside), and return once
        they are all gone: the next attempt is released only then, because a killed helper
        (an async checkpoint writer) holds its GPU memory until it has exited."""
        keep = {self.zygote.pid} if self.zygote is not None and self.zygote.pid else set()
        deadline = time.monotonic() + self.KILL_WAIT_SECONDS
        while True:
            alive = descendants(os.getpid(), keep)
            for pid in alive:
                send(pid, signal.SIGKILL)
            self.reap()
            if (not self.procs and not alive) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.procs.clear()
        self.unclaimed.clear()
        self.ended.clear()
