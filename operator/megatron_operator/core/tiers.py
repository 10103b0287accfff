"""The in-memory checkpoint tiers of a job (pure): whether it has them, and the host memory they
hold (megatron_contract/tiers.py has the rule that picks a tier at restore)."""

from __future__ import annotations

import math
from typing import Any

from megatron_contract import tiers
from megatron_contract.ladder import IN_PLACE
from megatron_operator.api.base import quantity_value
from megatron_operator.api.errors import FieldError
from megatron_operator.api.spec import MegatronJobSpec
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.memory import (
    MemoryEstimate,
    ParallelDegrees,
    snapshot_bytes,
    tier_bytes_per_pod,
)

MIB = 1024**2


def strategy(spec: MegatronJobSpec) -> str:
    """How the pods' launchers handle a failed rank (ladder.choose reads this from the pods):
    spec.restartPolicy.strategy, for the built-in trainer and a trainer.command alike (the
    launcher restarts a command's rank processes in place as it does the worker's)."""
    return spec.restart_policy.strategy


def enabled(spec: MegatronJobSpec) -> bool:
    """The pods get a memory volume: snapshots are asked for and a pod can outlive its ranks
    (restart strategy InPlace; a recreated pod keeps no memory). Not with Megatron FSDP: its
    state is a DTensor state dict (fsdp_dtensor), not the sharded state dict Megatron-Core's
    tensor-aware state dict is made from."""
    return (
        spec.checkpoint.memory.interval > 0
        and strategy(spec) == IN_PLACE
        and not spec.parallelism.fsdp
    )


def replicated(spec: MegatronJobSpec) -> bool:
    return spec.checkpoint.memory.replica and spec.resources.nodes > 1


def pod_bytes(
    spec: MegatronJobSpec, mem: MemoryEstimate | None, d: ParallelDegrees, precision: str | None
) -> int | None:
    """Host memory the tiers hold in each pod at most (the memory volume's files and the ranks'
    staging buffers); None when off or not estimable (no model or training settings)."""
    return _bytes(spec, mem, d, precision, tiers.GENERATIONS + tiers.STAGED)


def volume_bytes(
    spec: MegatronJobSpec, mem: MemoryEstimate | None, d: ParallelDegrees, precision: str | None
) -> int | None:
    """What the pod's memory volume holds at most: the snapshots' files alone."""
    return _bytes(spec, mem, d, precision, tiers.GENERATIONS)


def _bytes(
    spec: MegatronJobSpec,
    mem: MemoryEstimate | None,
    d: ParallelDegrees,
    precision: str | None,
    steps: int,
) -> int | None:
    if not enabled(spec) or mem is None or precision is None or d.fsdp:
        return None
    on_gpu = spec.resources.accelerator != "none"
    one = snapshot_bytes(mem.parameters_per_gpu, precision, d.dp * d.cp, dedup_weights=on_gpu)
    return tier_bytes_per_pod(one, spec.resources.procs_per_node, replicated(spec), steps)


def size_limit(held: int) -> str:
    """The memory volume's sizeLimit: the estimate with room to spare (a full volume fails the
    snapshot, which the trainer then skips; it never evicts the pod)."""
    return f"{math.ceil(held * 1.25 / MIB) + 256}Mi"


def host_memory_error(spec: MegatronJobSpec, held: int | None) -> FieldError | None:
    """The job's pods cannot hold the tiers: its memory limit is below their estimate."""
    limit = spec.resources.limits.get("memory")
    if held is None or limit is None:
        return None
    if held <= quantity_value(limit):
        return None
    replica = " and the copy for the previous pod's ranks" if replicated(spec) else ""
    return FieldError(
        "spec.checkpoint.memory",
        f"the in-memory checkpoints hold about {held / 1024**3:.1f} GiB per pod (every rank's "
        f"snapshot{replica}, two steps while one is written, and one more in the ranks' "
        f"buffers) but resources.limits.memory is "
        f"{limit}: raise resources.limits.memory, set checkpoint.memory.replica: false, or "
        "checkpoint.memory.interval: 0 (no in-memory checkpoints)",
    )


MAX_RESTORES = 16  # status.restores keeps the newest this many


def remember(st: JobStatus, attempt: int, tier: str, step: int | None) -> None:
    """Record in status.restores where `attempt` restored from (once per attempt)."""
    kept = [
        r
        for r in st.restores or []
        if isinstance(r.get("attempt"), int) and r.get("attempt") != attempt
    ]
    entry: dict[str, Any] = {"attempt": attempt, "tier": tier}
    if step is not None:
        entry["step"] = step
    kept = sorted([*kept, entry], key=lambda r: r.get("attempt", 0))
    st.restores = kept[-MAX_RESTORES:]
