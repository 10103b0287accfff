"""In-memory checkpoints: each rank's state in its pod's memory, a copy in the next pod's.

This is Megatron-LM's `--non-persistent-ckpt-type local` (megatron/training/checkpointing.py,
core_v0.16.1): Megatron-Core turns the rank's sharded state dict into a tensor-aware state dict
(`MCoreTensorAwareStateDict`), and nvidia-resiliency-ext's `LocalCheckpointManager` writes it as
one file per rank and step into a local directory, `<dir>/<session>/<rank>/iter_NNNNNNN_<rank>_
local.pt`, written as `.dirty` and renamed when whole. `find_latest` all-gathers the ids every
rank holds and takes the newest step that covers every rank: a step is used only when every
rank's file of it exists somewhere, so a snapshot cut off on one rank is never restored. Older
steps are deleted once a newer one is complete on every rank (two generations at most).

The directory is the pod's memory volume (an emptyDir with `medium: Memory`), which outlives the
ranks (an in-place restart finds it) and dies with the pod. The copy of each rank's file goes to
the same local rank of the next pod (`tiers.replica_target`), into its directory under the
sender's rank: after a pod is replaced, its new ranks find their files in the next pod's memory
and nvidia-resiliency-ext's retrieval sends them over. Which tier is used is
`megatron_contract.tiers.choose`, Megatron-LM's rule: memory when at least as new as the
durable checkpoint.

Where nvidia-resiliency-ext 0.4.1 needs CUDA, and what runs instead:
- its only replication strategy, `CliqueReplicationStrategy`, copies within fixed groups of
  ranks (`--replication-jump`, `--replication-factor`: the world size must divide into them, so
  an odd number of pods cannot be paired). `RingReplication` keeps its interface, ids and
  retrieval, and sends each rank's state to one peer pod, for any number of pods;
- `GroupWrapper.isend_state_dict`/`irecv_state_dict` (the retrieval after a pod was replaced)
  stage every tensor with `.cuda()`: `HostGroup` sends host tensors as they are over gloo and
  keeps their CUDA staging over NCCL;
- `MCoreTensorAwareStateDict`'s `fully_parallel` algorithm (Megatron-LM's default, each DP rank
  keeping a share of the replicated weights) exchanges the shards at load with `.cuda()`
  tensors (exchange_utils.py): the CPU platform uses `atomic`, each rank keeping all it holds;
- `BaseCheckpointManager.save(is_async=True)` waits with `torch.cuda.synchronize()`: snapshots
  are written synchronously here (to memory; the benchmark measures the stall).
The file format and the semantics (ids, completeness, cleanup, retrieval) are theirs.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.base_manager import (
    CheckpointingException,
    SameMachineReplicationException,
)
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import (
    LocalCheckpointManager,
)
from nvidia_resiliency_ext.checkpointing.local.replication.group_utils import GroupWrapper
from nvidia_resiliency_ext.checkpointing.local.replication.strategies import (
    CliqueReplicationStrategy,
)

from megatron_contract import tiers
from megatron_contract.config import MemoryConfig, TrainerConfig
from megatron_contract.env import MEMORY_CHECKPOINT_DIR

from .platform import Platform

log = logging.getLogger(__name__)

_FILE = re.compile(r"iter_(\d+)_(\d+)_local(\.dirty)?\.pt")


class HostGroup(GroupWrapper):  # type: ignore[misc]
    """nvidia-resiliency-ext's GroupWrapper whose state-dict send/receive also runs over gloo:
    theirs stages every tensor on the GPU (`.cuda()`), which a CPU rank has not."""

    def _on_host(self) -> bool:
        return bool(self.backend == "gloo")

    def isend_state_dict(self, state_dict: Any, dst: int) -> dict[str, float]:
        if not self._on_host():
            return dict(super().isend_state_dict(state_dict, dst))
        tensors = state_dict.pop_tensors()
        self.send_object(state_dict, dst)
        for tensor in tensors:
            torch.distributed.send(tensor.contiguous(), dst, group=self.group)
        state_dict.insert_tensors(tensors)
        return {"data_sent": float(sum(t.nbytes for t in tensors))}

    def irecv_state_dict(self, src: int) -> tuple[Any, dict[str, float]]:
        if not self._on_host():
            received, data = super().irecv_state_dict(src)
            return received, dict(data)
        hollow = self.recv_object(src)
        hollow.init_tensors()
        for tensor in hollow.tensors:
            torch.distributed.recv(tensor, src, group=self.group)
        return hollow, {"data_recv": float(sum(t.nbytes for t in hollow.tensors))}


class RingReplication(CliqueReplicationStrategy):  # type: ignore[misc]
    """Each rank's snapshot also goes to the same local rank of the next pod (one copy, any
    number of pods); retrieval is nvidia-resiliency-ext's (`retrieve_plan`: a rank missing its
    file gets it from a rank that holds it), over the whole world."""

    def __init__(self, procs_per_node: int, world_size: int, comm_device: str) -> None:
        super().__init__(HostGroup(None), target_device="cpu")
        self.procs_per_node, self.world_size = procs_per_node, world_size
        self.comm_device = comm_device
        self.sent_bytes = 0

    def replicate(self, local_ckpt: Any, id_: Any) -> tuple[list[Any], list[Any]]:
        rank = torch.distributed.get_rank()
        target = tiers.replica_target(rank, self.procs_per_node, self.world_size)
        source = tiers.replica_source(rank, self.procs_per_node, self.world_size)
        tensors = local_ckpt.pop_tensors()
        body = pickle.dumps((local_ckpt, id_))
        local_ckpt.insert_tensors(tensors)
        # The hollow state dict's pickle, then every tensor's bytes in one host buffer.
        flat = _flatten(tensors)
        dev = self.comm_device
        sizes = torch.tensor([len(body), flat.numel()], dtype=torch.int64, device=dev)
        their_sizes = torch.empty_like(sizes)
        _exchange([(sizes, target)], [(their_sizes, source)])
        their_body_len, their_flat_len = (int(x) for x in their_sizes.tolist())
        their_body = _transfer(
            torch.frombuffer(bytearray(body), dtype=torch.uint8),
            their_body_len,
            target,
            source,
            dev,
        )
        their_flat = _transfer(flat, their_flat_len, target, source, dev)
        peer, peer_id = pickle.loads(their_body.numpy().tobytes())
        # The copy is kept in host memory (as the manager stages its own snapshot), marked with
        # the device it came from so that a load puts it back there.
        devices = [sh.orig_device for sh in peer._sharded_tensors]
        for sh in peer._sharded_tensors:
            sh.orig_device = "cpu"
        peer.init_tensors()
        for sh, device in zip(peer._sharded_tensors, devices, strict=True):
            if device != "cpu":
                sh.orig_device = device
        _unflatten(their_flat, list(peer.tensors))
        self.sent_bytes = int(flat.numel())
        return [local_ckpt, peer], [id_, peer_id]


# Over NCCL the bytes are staged on the GPU this much at a time: a copy of a rank's whole state
# on its GPU would take the memory training needs.
CHUNK_BYTES = 256 * 1024**2


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, in order, in one host buffer."""
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8).cpu() for t in tensors]
    return torch.cat(parts)


def _transfer(
    mine: torch.Tensor, theirs: int, target: int, source: int, device: str
) -> torch.Tensor:
    """Send the host buffer `mine` to `target` while receiving `theirs` bytes from `source`;
    gloo sends host memory as it is, NCCL through device buffers of CHUNK_BYTES."""
    received = torch.empty(theirs, dtype=torch.uint8)
    if device == "cpu":
        _exchange([(mine, target)], [(received, source)])
        return received
    for start in range(0, max(mine.numel(), theirs), CHUNK_BYTES):
        send = mine[start : start + CHUNK_BYTES].to(device)
        recv = torch.empty(
            max(min(CHUNK_BYTES, theirs - start), 0), dtype=torch.uint8, device=device
        )
        _exchange(
            [(send, target)] if send.numel() else [], [(recv, source)] if recv.numel() else []
        )
        received[start : start + recv.numel()].copy_(recv.cpu())
    return received


def _unflatten(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in into:
        n = tensor.numel() * tensor.element_size()
        tensor.view(-1).view(torch.uint8).copy_(flat[offset : offset + n])
        offset += n
    if offset != flat.numel():
        raise ValueError(f"a peer's snapshot has {flat.numel()} bytes, its layout {offset}")


def _exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]) -> None:
    if not sends and not recvs:
        return
    ops = [torch.distributed.P2POp(torch.distributed.isend, t, peer) for t, peer in sends]
    ops += [torch.distributed.P2POp(torch.distributed.irecv, t, peer) for t, peer in recvs]
    for work in torch.distributed.batch_isend_irecv(ops):
        work.wait()


class PodMemory(LocalCheckpointManager):  # type: ignore[misc]
    """LocalCheckpointManager whose failed write (a full memory volume) fails the snapshot on
    every rank alike instead of ending this rank: the manager's check that follows finds the
    step incomplete everywhere and raises CheckpointingException on every rank, which
    `Snapshots.save` logs. Training goes on with the previous snapshot."""

    def _save(self, state_dict: Any, ckpt_id: Any) -> None:
        try:
            super()._save(state_dict, ckpt_id)
        except SameMachineReplicationException:
            raise
        except OSError as err:
            log.warning("snapshot %s not written to %s: %s", ckpt_id[:2], self.local_ckpt_dir, err)
            for path in Path(self.local_ckpt_dir).glob("*.dirty.pt"):
                path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Found:
    """What the ranks agreed to restore from memory, before the model exists."""

    tier: str  # tiers.MEMORY or tiers.PEER
    step: int
    state: Any  # this rank's MCoreTensorAwareStateDict
    seconds: float  # finding and fetching it

    @property
    def record(self) -> dict[str, Any]:
        common = self.state.common_state_dict
        trainer = common.get("trainer") if isinstance(common, dict) else None
        return trainer if isinstance(trainer, dict) else {}


class Snapshots:
    """The in-memory tiers of one rank. Every method is collective."""

    def __init__(self, cfg: TrainerConfig, memory: MemoryConfig, platform: Platform) -> None:
        self.cfg, self.memory, self.platform = cfg, memory, platform
        self.rank = torch.distributed.get_rank()
        world = torch.distributed.get_world_size()
        procs = cfg.resources.procs_per_node
        self.replicated = memory.replica and world > procs
        strategy = (
            RingReplication(procs, world, platform.device.type if platform.is_cuda else "cpu")
            if self.replicated
            else None
        )
        # The job's uid keeps another run's files (a local run's reused work directory) apart.
        session = cfg.job.uid or cfg.job.name
        # The pod's own directory: the env names it (each local "pod" has its own), else the
        # config's (the volume's mount, the same in every pod).
        root = os.environ.get(MEMORY_CHECKPOINT_DIR) or memory.dir
        self.manager = PodMemory(root, session_id=session, repl_strategy=strategy)
        # Megatron-LM's default algorithm where it runs (CUDA), `atomic` on the CPU platform.
        self.algo = "fully_parallel" if platform.is_cuda else "atomic"
        self.cached_distribution: Any = None
        self.newest: int | None = None
        self.bytes = 0  # this rank's last snapshot (its own state, not the copy it holds)
        self.seconds: list[float] = []  # each snapshot's stall (state dict, copy, write)

    @property
    def dir(self) -> Path:
        return Path(self.manager.local_ckpt_dir)

    # -- restore ------------------------------------------------------------------------------

    def find(self, durable: int | None) -> tuple[str, int | None, Found | None]:
        """(tier, step, what to load) by `tiers.choose`; fetches a lost rank's copy from its
        peer. Also drops what this rank holds beyond the chosen step (an attempt's unfinished
        snapshot), so the next attempt writes those steps anew."""
        started = time.monotonic()
        newest = self.manager.find_latest()
        step = newest if newest >= 0 else None
        own = step is not None and any(
            i == step and r == self.rank for i, r, _ in self.manager._my_ckpt_ids()
        )
        all_own = _all(own, self.platform)
        tier, chosen = tiers.choose(step, all_own, durable)
        found = None
        if tier in (tiers.MEMORY, tiers.PEER) and chosen is not None:
            state, _ = self.manager.load()
            found = Found(tier, chosen, state, time.monotonic() - started)
            self.newest = chosen
        keep = chosen if tier in (tiers.MEMORY, tiers.PEER) and chosen is not None else -1
        self._drop_after(keep)
        return tier, chosen, found

    def _drop_after(self, step: int) -> None:
        """Delete this rank's files newer than `step` (and half-written ones): a step the ranks
        train again is written again (nvidia-resiliency-ext opens the file exclusively)."""
        if not self.dir.is_dir():
            return
        for path in self.dir.iterdir():
            match = _FILE.fullmatch(path.name)
            if match and (match.group(3) or int(match.group(1)) > step):
                path.unlink(missing_ok=True)
        self.manager.latest_iteration = -1  # its cache of find_latest

    def state_dict(self, found: Found, template: dict[str, Any]) -> dict[str, Any]:
        """The loaded state in the layout of `template` (Checkpointer.state_dict, is_loading)."""
        loaded: dict[str, Any] = found.state.to_state_dict(
            template,
            algo=self.algo,
            parallelization_group=parallel_state.get_data_parallel_group(
                with_context_parallel=True
            ),
        )
        return loaded

    # -- save -----------------------------------------------------------------------------------

    def due(self, iteration: int) -> bool:
        return iteration % self.memory.interval == 0

    def save(self, iteration: int, state: dict[str, Any]) -> None:
        """Write `iteration`'s snapshot (the sharded state dict of Checkpointer.state_dict)."""
        tasd, self.cached_distribution = MCoreTensorAwareStateDict.from_state_dict(
            state,
            algo=self.algo,
            parallelization_group=parallel_state.get_data_parallel_group(
                with_context_parallel=True
            ),
            cached_metadata=self.cached_distribution,
        )
        self.bytes = sum(t.nbytes for t in tasd.tensors)
        try:
            self.manager.save(tasd, iteration, is_async=False)
        except CheckpointingException as err:  # raised on every rank alike (PodMemory)
            if self.rank == 0:
                log.warning("snapshot of iteration %d skipped: %s", iteration, err)
            return
        self.newest = iteration

    def held_bytes(self) -> int:
        """Bytes of snapshot files in this rank's directory (its own and the copy it holds)."""
        if not self.dir.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.dir.iterdir() if p.is_file())


def _all(flag: bool, platform: Platform) -> bool:
    t = torch.tensor([0 if flag else 1], dtype=torch.int32, device=platform.device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return int(t.item()) == 0


def check_record(record: dict[str, Any], fingerprint: dict[str, Any], cfg: TrainerConfig) -> str:
    """Why a snapshot cannot continue this job (a changed config), or "" when it can."""
    if record.get("model") != fingerprint:
        return "the model changed"
    if record.get("globalBatchSize") != cfg.training.global_batch_size:
        return "training.globalBatchSize changed"
    if record.get("precision") != cfg.training.precision:
        return "training.precision changed"
    return ""
