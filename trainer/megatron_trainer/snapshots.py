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
  stage every tensor with `.cuda()`: `HostGroup` sends host tensors as they are over gloo (the
  snapshots have a gloo group of their own, on CUDA too);
- `MCoreTensorAwareStateDict`'s `fully_parallel` algorithm (Megatron-LM's default, each DP rank
  keeping a share of the replicated weights) exchanges the shards at load with `.cuda()`
  tensors (exchange_utils.py): the CPU platform uses `atomic`, each rank keeping all it holds;
- `BaseCheckpointManager.save(is_async=True)` waits with `torch.cuda.synchronize()` and leaves
  the copy to the peer inside the step, and its AsyncRequest needs Megatron-LM's async queue. A
  snapshot here stalls training only for its state dict and the copy of its tensors into host
  memory; a thread then sends the copy to the peer, writes the file, and checks with every rank
  that the step is complete (`PodMemory.write`, their save's steps on the snapshots' own group),
  while the next step trains. That step's record waits for it, so a failure loses at most one
  step (the benchmark measures the stall).
The file format and the semantics (ids, completeness, cleanup, retrieval) are theirs.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import threading
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

    def __init__(self, procs_per_node: int, world_size: int, group: Any) -> None:
        super().__init__(HostGroup(group), target_device="cpu")
        self.procs_per_node, self.world_size = procs_per_node, world_size
        self.group = group
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

        def swap(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            """Send `mine` to the target while `theirs` is filled from the source."""
            _exchange([(mine, target)], [(theirs, source)], self.group)
            return theirs

        sizes = torch.tensor([len(body), flat.numel()], dtype=torch.int64)
        body_len, flat_len = (int(x) for x in swap(sizes, torch.empty_like(sizes)).tolist())
        mine = torch.frombuffer(bytearray(body), dtype=torch.uint8)
        their_body = swap(mine, torch.empty(body_len, dtype=torch.uint8))
        their_flat = swap(flat, torch.empty(flat_len, dtype=torch.uint8))
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


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, in order, in one host buffer."""
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8).cpu() for t in tensors]
    return torch.cat(parts)


def _unflatten(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in into:
        n = tensor.numel() * tensor.element_size()
        tensor.view(-1).view(torch.uint8).copy_(flat[offset : offset + n])
        offset += n
    if offset != flat.numel():
        raise ValueError(f"a peer's snapshot has {flat.numel()} bytes, its layout {offset}")


def _exchange(
    sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], group: Any
) -> None:
    if not sends and not recvs:
        return
    ops = [torch.distributed.P2POp(torch.distributed.isend, t, peer, group) for t, peer in sends]
    ops += [torch.distributed.P2POp(torch.distributed.irecv, t, peer, group) for t, peer in recvs]
    for work in torch.distributed.batch_isend_irecv(ops):
        work.wait()


class PodMemory(LocalCheckpointManager):  # type: ignore[misc]
    """LocalCheckpointManager on the snapshots' own process group, whose failed write (a full
    memory volume) fails the snapshot on every rank alike instead of ending this rank: the
    manager's check that follows finds the step incomplete everywhere and raises
    CheckpointingException on every rank, which `Snapshots` logs. Training goes on with the
    previous snapshot."""

    latest_iteration: int  # the base class's cache of find_latest (-1: none)

    def __init__(self, root: str, session_id: str, repl_strategy: Any, group: Any) -> None:
        super().__init__(root, session_id=session_id, repl_strategy=repl_strategy)
        self.group = group

    def find_latest(self) -> int:
        """BaseCheckpointManager.find_latest on `group` (theirs gathers on the default group,
        which training's collectives use at the same time from the main thread)."""
        if self.latest_iteration != -1:
            return self.latest_iteration
        wrapper = GroupWrapper(self.group)
        ids = list(self._my_ckpt_ids())
        if self.repl_strategy is None:  # no copies: only this rank's own files count
            ids = [id_ for id_ in ids if id_[1] == self.rank]
        self.globally_available_ids = wrapper.all_gather_object(ids)
        coverage: dict[int, set[int]] = {}
        for held in self.globally_available_ids:
            for iteration, rank, session in held:
                assert session == self.session_id
                coverage.setdefault(iteration, set()).add(rank)
        everyone = set(wrapper.ranks)
        newest = max((i for i, ranks in coverage.items() if ranks == everyone), default=-1)
        self.latest_iteration = newest
        return newest

    def write(self, state_dict: Any, iteration: int) -> None:
        """BaseCheckpointManager.save(is_async=False) on `group`, for a state dict whose tensors
        are already private host copies: replicate, write, wait for every rank, check that the
        step is complete everywhere, then drop the older steps (or this one, if incomplete)."""
        assert self.latest_iteration < iteration, (self.latest_iteration, iteration)
        own = self._ckpt_id(iteration)
        if self.repl_strategy is not None:
            states, ids = self.repl_strategy.replicate(state_dict, own)
            by_id = dict(zip(ids, states, strict=True))
        else:
            by_id = {own: state_dict}
        self.latest_iteration = -1
        self._save_fn(by_id)
        torch.distributed.barrier(group=self.group)
        complete = self.find_latest()
        self.latest_iteration = -1
        if complete < iteration:
            self._cleanup_failed_save(iteration)
            raise CheckpointingException(
                f"Failure during saving local checkpoint from iteration {iteration}"
                f" (last valid iteration is {complete})"
            )
        self._cleanup(iteration)

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
        # The snapshots' own group, on the host: the writer thread's collectives (the copy to
        # the peer, the check that every rank wrote the step) run beside training's on the main
        # group, and a group's collectives must come in one order on every rank.
        self.group = torch.distributed.new_group(backend="gloo")
        strategy = RingReplication(procs, world, self.group) if self.replicated else None
        # The job's uid keeps another run's files (a local run's reused work directory) apart.
        session = cfg.job.uid or cfg.job.name
        # The pod's own directory: the env names it (each local "pod" has its own), else the
        # config's (the volume's mount, the same in every pod).
        root = os.environ.get(MEMORY_CHECKPOINT_DIR) or memory.dir
        self.manager = PodMemory(root, session, strategy, self.group)
        # Megatron-LM's default algorithm where it runs (CUDA), `atomic` on the CPU platform.
        self.algo = "fully_parallel" if platform.is_cuda else "atomic"
        self.cached_distribution: Any = None
        self.newest: int | None = None
        self.bytes = 0  # this rank's last snapshot (its own state, not the copy it holds)
        # Each snapshot's stall of the training loop: its state dict and host copy, and any wait
        # for its write before the next step's record.
        self.seconds: list[float] = []
        self.writes: list[float] = []  # each snapshot's write, in the writer thread
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

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
        """Start `iteration`'s snapshot (the sharded state dict of Checkpointer.state_dict): its
        tensors are copied to host memory here, so training may change them at once, and the
        copy to the peer and the write go on in a thread. The previous one must be done
        (`wait`)."""
        started = time.monotonic()
        assert self.writer is None, "the previous snapshot was not waited for"
        tasd, self.cached_distribution = MCoreTensorAwareStateDict.from_state_dict(
            state,
            algo=self.algo,
            parallelization_group=parallel_state.get_data_parallel_group(
                with_context_parallel=True
            ),
            cached_metadata=self.cached_distribution,
        )
        tasd.copy_tensors_to_cpu(non_blocking=False)  # a private copy, even of host tensors
        self.bytes = sum(t.nbytes for t in tasd.tensors)
        self.writer = threading.Thread(
            target=self._write, args=(tasd, iteration), name="snapshot-writer", daemon=True
        )
        self.writer.start()
        self.seconds.append(time.monotonic() - started)

    def _write(self, tasd: Any, iteration: int) -> None:
        started = time.monotonic()
        try:
            self.manager.write(tasd, iteration)
        except CheckpointingException as err:  # raised on every rank alike (PodMemory)
            if self.rank == 0:
                log.warning("snapshot of iteration %d skipped: %s", iteration, err)
        except BaseException as err:  # handed to the main thread by wait()
            self.failure = err
        else:
            self.newest = iteration
        self.writes.append(time.monotonic() - started)

    def wait(self) -> float:
        """Wait for the snapshot being written; the seconds waited (part of its stall). Called
        before each step's record, so that a recorded step's previous snapshot is complete:
        a failure then loses at most the step in flight and the one recorded."""
        if self.writer is None:
            return 0.0
        started = time.monotonic()
        self.writer.join()
        self.writer = None
        waited = time.monotonic() - started
        if self.seconds:
            self.seconds[-1] += waited
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        return waited

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
