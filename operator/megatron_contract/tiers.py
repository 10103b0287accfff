"""Checkpoint tiers: where an attempt's ranks restore from, written once (docs/contract.md §6).

Three tiers hold a job's training state:

- **memory**: every `checkpoint.memory.interval` steps each rank writes its state into its pod's
  memory volume (an emptyDir with `medium: Memory`). It lives as long as the pod, so it survives
  an in-place restart of the ranks, and nothing else;
- **peer**: with `checkpoint.memory.replica`, each rank's state is also copied into the memory
  of the next pod (node rank + 1, the last pod's into the first's): the ranks of one lost pod
  find theirs there;
- **durable**: the torch_dist checkpoints on the claim or object storage, every
  `checkpoint.saveInterval` steps.

The rule (`choose`) is Megatron-LM's own (`_load_base_checkpoint`: a non-persistent checkpoint
at least as new as the persistent one wins), with the tier named: the newest step that every rank
holds completely in memory, its own or a peer's, when it is not older than the newest durable
checkpoint; else the durable one; else none. Which rung restarted the gang decides what can
survive (`expected`): in place every pod's memory does, after a pod replacement all but one
pod's (its ranks read the peer copy), after a recreate none.

The trainer reports the tier and step it restored from in its progress record (`KEY`); the
operator reads it as tenant data (`parse_restored` never raises). Standard library only, and
Python 3.8 compatible: the launcher imports this package.
"""

from __future__ import annotations

from typing import Any

MEMORY = "Memory"  # every rank read its own pod's memory
PEER = "Peer"  # some rank read a copy in another pod's memory, the rest their own
DURABLE = "Durable"  # the torch_dist checkpoint on the claim or object storage
NONE = "None"  # nothing to restore: the attempt started from scratch (or checkpoint.init)
TIERS = (MEMORY, PEER, DURABLE, NONE)

KEY = "restored"  # the progress record's key: {"tier": ..., "step": ...}
DEFAULT_INTERVAL = 1
# A snapshot is written beside the previous one, which is deleted only once the new one is
# complete on every rank (so a kill during the write leaves the older one): two generations.
GENERATIONS = 2
# Besides the volume's files, each rank's process keeps one step in host memory between
# snapshots: the buffer its tensors are copied into and the one its peer's copy arrives in.
STAGED = 1

# The rung of a restart (the operator's status.lastFailure.rung) → the best tier that survives it.
_EXPECTED = {"InPlace": MEMORY, "ReplacePod": PEER, "Recreate": DURABLE}


def expected(rung: str | None, replica: bool) -> str:
    """The cheapest tier the rung leaves: what the attempt restores from when every snapshot
    it needs completed. Without a replica, a replaced pod's ranks have only the durable tier."""
    tier = _EXPECTED.get(rung or "", DURABLE)
    if tier == PEER and not replica:
        return DURABLE
    return tier


def choose(
    memory_step: int | None, all_own: bool, durable_step: int | None
) -> tuple[str, int | None]:
    """(tier, step) to restore from. `memory_step`: the newest step every rank holds completely
    in some pod's memory (None: none); `all_own`: every rank holds that step in its own pod's
    memory; `durable_step`: the newest complete durable checkpoint (None: none)."""
    if memory_step is not None and (durable_step is None or memory_step >= durable_step):
        return (MEMORY if all_own else PEER), memory_step
    if durable_step is not None:
        return DURABLE, durable_step
    return NONE, None


def replica_target(rank: int, procs_per_node: int, world_size: int) -> int:
    """The rank whose pod's memory holds `rank`'s copy: the same local rank of the next pod."""
    return (rank + procs_per_node) % world_size


def replica_source(rank: int, procs_per_node: int, world_size: int) -> int:
    """The rank whose copy `rank` holds: the same local rank of the previous pod."""
    return (rank - procs_per_node) % world_size


def restored_json(tier: str, step: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"tier": tier}
    if step is not None:
        body["step"] = step
    return body


def parse_restored(value: object, max_step: int = 2**62) -> tuple[str, int | None] | None:
    """(tier, step) of a record's `restored`, or None when absent or not in this shape."""
    if not isinstance(value, dict):
        return None
    tier = value.get("tier")
    if tier not in TIERS:
        return None
    step = value.get("step")
    if step is None:
        return str(tier), None
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= max_step:
        return None
    return str(tier), step
