"""SIGTERM handling and fault injection inside a rank (stdlib only).

SIGTERM (and SIGINT, for Ctrl-C in a terminal) only sets a flag; the training loop turns it into a
collective decision after each step, so every rank, in every pod, checkpoints the same iteration
even when the signal reached them at slightly different times.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from types import FrameType

from megatron_contract.env import INJECT_FAILURE, LAUNCHER_PID, FailureInjection

log = logging.getLogger(__name__)


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
        self.signal_name: str | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.requested:
            self.signal_name = signal.Signals(signum).name
        self.requested = True


class InjectedFailure(RuntimeError):
    """An uncaught error inside a rank (MEGATRON_INJECT_FAILURE ...:RAISE), standing in for an
    OOM or a NCCL error."""


def inject_failures(
    injections: tuple[FailureInjection, ...], iteration: int, rank: int, stop: StopFlag
) -> None:
    """Fire the injections for (`iteration`, `rank`): SIGKILL this rank, SIGTERM the pod, or
    raise InjectedFailure.

    TERM goes to the launcher (as the kubelet's would), which forwards it to every local rank; we
    wait until it has arrived here so the stop is agreed at this very iteration.
    """
    for injection in injections:
        if injection.step != iteration or injection.rank != rank:
            continue
        log.warning("MEGATRON_INJECT_FAILURE: SIG%s at iteration %d", injection.signal, iteration)
        sys.stdout.flush()
        sys.stderr.flush()
        if injection.signal == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        if injection.signal == "STOP":  # a hang: the gang waits in the next collective
            os.kill(os.getpid(), signal.SIGSTOP)
            continue
        if injection.signal == "RAISE":
            raise InjectedFailure(f"{INJECT_FAILURE} at iteration {iteration}, rank {rank}")
        launcher = int(os.environ.get(LAUNCHER_PID, "0") or 0)
        os.kill(launcher or os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30.0
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
