"""Process helpers of the launcher: subreaper, parent-death signal, exit codes, descendants.

Standard library only, and no import of our own: the launcher, the rank processes and the zygote
share these.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
# Resolved before any fork: the child of a multi-threaded launcher (the coordinator runs in
# threads) must not load a library between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def prctl(option: int, value: int) -> None:
    if _LIBC is not None:
        _LIBC.prctl(option, value, 0, 0, 0)


def become_subreaper() -> None:
    prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def exit_code(status: int) -> int:
    """Shell convention: a rank killed by signal N reports 128 + N (SIGKILL -> 137)."""
    return 128 - status if status < 0 else status


def wait_code(status: int) -> int:
    """The exit code of a `os.waitpid` status, in the shell's convention (`exit_code`).
    `os.waitstatus_to_exitcode` does this from Python 3.9; the launcher runs on 3.8 too."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 128 + os.WSTOPSIG(status)  # stopped: only with WUNTRACED, which we never pass


def send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def descendants(root: int, keep: set[int] | None = None) -> list[int]:
    """All live descendants of `root`, from /proc (no psutil needed in the launcher), except the
    processes in `keep` and theirs."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may contain spaces.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if keep and child in keep:
                continue
            found.append(child)
            todo.append(child)
    return found
