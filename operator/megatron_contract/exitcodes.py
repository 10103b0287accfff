"""Exit codes of `python -m megatron_trainer` (docs/contract.md §3) and what the operator does."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    # The loss or the gradients became NaN/Inf; the step failed before anything was saved. The
    # same number as Megatron-LM's EXIT_CODE_FAILED_ON_RESULT_VALIDATION. A restart would replay
    # the same data onto the same weights, so the operator's default rule fails the job (a
    # restartPolicy rule can choose Restart instead, e.g. after lowering the learning rate).
    NON_FINITE = 17
    # EX_TEMPFAIL: with the InPlace strategy, the launcher lost the coordinator (the launcher of
    # node rank 0) and could not report a failed rank, or waited for a decision in vain; its pod
    # fails so that the kubelet tells the operator instead. A restart (counted) by default.
    COORDINATOR_LOST = 75
    # EX_CONFIG: the job can never run as written; the operator fails it at once.
    CONFIG = 78
    # 128 + SIGTERM: told to stop, saved a checkpoint first; a restart that is not counted.
    SIGTERM = 143
    # 128 + SIGKILL: killed (OOM killer, a node going away, or a SIGKILL).
    SIGKILL = 137
