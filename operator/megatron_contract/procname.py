"""How a rank forked by its pod's zygote names itself, for the tools that look for a rank.

A forked process keeps the environment its zygote was started with in /proc/PID/environ (the
kernel shows a process's environment as it was at exec), so a forked rank's RANK cannot be read
there. It sets its command name (`ps -o comm`, `top`, psutil's `name()`) to `mt-rank-<global
rank>` instead; the zygote's environment holds no rank's variables. A rank started as its own
process keeps its command name (`python`) and has RANK in its environment.
"""

from __future__ import annotations

RANK_COMM_PREFIX = "mt-rank-"
COMM_MAX = 15  # the kernel's TASK_COMM_LEN, less the terminating NUL


def rank_comm(rank: int | str) -> str:
    return f"{RANK_COMM_PREFIX}{rank}"[:COMM_MAX]


def rank_of_comm(comm: str) -> int | None:
    """The global rank a process names in its command name; None for any other process."""
    if not comm.startswith(RANK_COMM_PREFIX):
        return None
    tail = comm.strip()[len(RANK_COMM_PREFIX) :]
    return int(tail) if tail.isascii() and tail.isdigit() else None
