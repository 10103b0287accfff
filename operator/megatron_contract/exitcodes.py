"""Exit codes of `python -m megatron_trainer` (docs/contract.md §3) and what the operator does."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # EX_CONFIG: the job can never run as written; the operator fails it at once.
    CONFIG = 78
    # 128 + SIGTERM: told to stop, saved a checkpoint first; a restart that is not counted.
    SIGTERM = 143
    # 128 + SIGKILL: killed (OOM killer, a node going away, or a SIGKILL).
    SIGKILL = 137
