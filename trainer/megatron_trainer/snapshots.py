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
  snapshot here stalls training only for its state dict and the copy of its tensors into a
  kept host buffer (`Staging`); the rank's writer thread then sends that buffer to the peer, writes the file, and checks with every rank
  that the step is complete (`PodMemory.write`, their save's steps on the snapshots' own group),
  while the next step trains. That step's record waits for it, so a failure loses at most one
  step (the benchmark measures the stall).
The file format and the semantics (ids, completeness, cleanup, retrieval) are theirs.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import queue
import re
import threading
import time
from collections.abc import Callable
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
        self.received: torch.Tensor | None = None

    def replicate(self, local_ckpt: Any, id_: Any) -> tuple[list[Any], list[Any]]:
        rank = torch.distributed.get_rank()
        target = tiers.replica_target(rank, self.procs_per_node, self.world_size)
        source = tiers.replica_source(rank, self.procs_per_node, self.world_size)
        tensors = local_ckpt.pop_tensors()
        body = pickle.dumps((local_ckpt, id_))
        local_ckpt.insert_tensors(tensors)
        # The hollow state dict's pickle, then every tensor's bytes in one host buffer (the
        # staging buffer itself, when the tensors are its views: no copy).
        flat = _flatten(tensors)

        def swap(mine: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
            """Send `mine` to the target while `theirs` is filled from the source."""
            _exchange([(mine, target)], [(theirs, source)], self.group)
            return theirs

        sizes = torch.tensor([len(body), flat.numel()], dtype=torch.int64)
        body_len, flat_len = (int(x) for x in swap(sizes, torch.empty_like(sizes)).tolist())
        mine = torch.frombuffer(bytearray(body), dtype=torch.uint8)
        their_body = swap(mine, torch.empty(body_len, dtype=torch.uint8))
        # Received into a buffer kept for the next snapshot (one write at a time): no new pages.
        self.received = _grown(self.received, flat_len, pin=False)
        their_flat = swap(flat, self.received[:flat_len])
        peer, peer_id = pickle.loads(their_body.numpy().tobytes())
        # The copy is kept in host memory (as the manager stages its own snapshot), as views of
        # the received bytes, each marked with the device it came from (insert_tensors) so that
        # a load puts it back there.
        shards = list(peer._sharded_tensors)
        offsets, total = _layout([(sh.dtype, sh.local_shape) for sh in shards])
        if total != flat_len:
            raise ValueError(f"a peer's snapshot has {flat_len} bytes, its layout {total}")
        peer.insert_tensors(
            [
                _view(their_flat, offset, sh.dtype, sh.local_shape)
                for sh, offset in zip(shards, offsets, strict=True)
            ]
        )
        self.sent_bytes = int(flat.numel())
        return [local_ckpt, peer], [id_, peer_id]


# Each tensor of a flat snapshot starts on this boundary, so that a view of its bytes has the
# alignment of any dtype.
ALIGN = 64


def _layout(tensors: list[tuple[torch.dtype, Any]]) -> tuple[list[int], int]:
    """Where each (dtype, shape) tensor starts in one flat buffer, and the buffer's size."""
    offsets, end = [], 0
    for dtype, shape in tensors:
        offsets.append(end)
        end += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return offsets, end


def _view(flat: torch.Tensor, offset: int, dtype: torch.dtype, shape: Any) -> torch.Tensor:
    size = math.prod(shape) * dtype.itemsize
    return flat[offset : offset + size].view(dtype).view(tuple(shape))


def _grown(buffer: torch.Tensor | None, size: int, pin: bool) -> torch.Tensor:
    """`buffer` if it holds `size` bytes, else a new host buffer (pinned: a device copies into
    it asynchronously)."""
    if buffer is not None and buffer.numel() >= size:
        return buffer
    return torch.empty(size, dtype=torch.uint8, pin_memory=pin)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes in one host buffer, by `_layout`: the buffer they are views of
    (a staged snapshot's), else a copy."""
    offsets, total = _layout([(t.dtype, t.shape) for t in tensors])
    if not tensors:
        return torch.empty(0, dtype=torch.uint8)
    if _views_of_one_buffer(tensors, offsets, total):
        storage = tensors[0].untyped_storage()
        start = _byte_offset(tensors[0])
        return torch.empty(0, dtype=torch.uint8).set_(storage, start, (total,), (1,))
    flat = torch.empty(total, dtype=torch.uint8)
    for tensor, offset in zip(tensors, offsets, strict=True):
        _view(flat, offset, tensor.dtype, tensor.shape).copy_(tensor.detach())
    return flat


def _byte_offset(tensor: torch.Tensor) -> int:
    """Where `tensor` starts in its storage (data_ptr is 0 for an empty tensor)."""
    return int(tensor.storage_offset()) * tensor.element_size()


def _views_of_one_buffer(tensors: list[torch.Tensor], offsets: list[int], total: int) -> bool:
    """The tensors lie in one host storage at `_layout`'s offsets (Staging's)."""
    storage = tensors[0].untyped_storage()
    start = _byte_offset(tensors[0])
    if tensors[0].device.type != "cpu" or start + total > storage.nbytes():
        return False
    return all(
        t.device.type == "cpu"
        and t.is_contiguous()
        and t.untyped_storage().data_ptr() == storage.data_ptr()
        and _byte_offset(t) - start == offset
        for t, offset in zip(tensors, offsets, strict=True)
    )


def _exchange(
    sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], group: Any
) -> None:
    if not sends and not recvs:
        return
    ops = [torch.distributed.P2POp(torch.distributed.isend, t, peer, group) for t, peer in sends]
    ops += [torch.distributed.P2POp(torch.distributed.irecv, t, peer, group) for t, peer in recvs]
    for work in torch.distributed.batch_isend_irecv(ops):
        work.wait()


class Staging:
    """The host buffer a snapshot's tensors are copied into, reused by the next snapshot (whose
    copy starts after this one's write ended: Snapshots.wait), so that a snapshot allocates
    nothing and touches no new page; the copies lie at `_layout`'s offsets, so the copy to the
    peer sends the buffer as it is. On CUDA the buffer is pinned and the copy from the device
    asynchronous, on the current stream, so it is done before the next step's kernels change
    the tensors; the writer waits for it (`ready`)."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffer: torch.Tensor | None = None
        self.shapes: list[tuple[torch.dtype, Any]] = []  # the layout of `views`
        self.views: list[torch.Tensor] = []  # the buffer's tensors, by `_layout`
        self.copied: Any = None  # the CUDA event after the last copy

    def stage(self, tasd: Any) -> int:
        """Replace every tensor of `tasd` by its copy in the buffer (Megatron-Core's
        copy_tensors_to_cpu, into a kept buffer); the bytes staged."""
        shards = list(tasd._sharded_tensors)
        sources = [sh.data for sh in shards]
        shapes = [(t.dtype, t.shape) for t in sources]
        if shapes != self.shapes:
            offsets, total = _layout(shapes)
            self.buffer = _grown(self.buffer, total, self.pin)
            self.views = [
                _view(self.buffer, offset, dtype, shape)
                for (dtype, shape), offset in zip(shapes, offsets, strict=True)
            ]
            self.shapes = shapes
        with torch.no_grad():
            if self.pin:  # from the device: each copy queued on the current stream
                for copy, source in zip(self.views, sources, strict=True):
                    copy.copy_(source, non_blocking=True)
            else:
                # One call for every tensor: the training thread takes the GIL back once, not
                # once a tensor (the writer thread holds it in between).
                torch._foreach_copy_(self.views, sources)
        for sh, source, copy in zip(shards, sources, self.views, strict=True):
            if source.device.type != "cpu" and not hasattr(sh, "orig_device"):
                sh.orig_device = source.device.type  # where a load puts it back
            sh.data = copy
        if self.pin:
            self.copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.copied.record()
        return sum(v.nbytes for v in self.views)

    def ready(self) -> None:
        """Block until the copies from the device are in the buffer."""
        if self.copied is not None:
            self.copied.synchronize()


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
        self.write_cpu: list[float] = []  # the writer thread's CPU seconds for each
        self.staging = Staging(pin=platform.is_cuda)
        self.writer: threading.Thread | None = None
        self.jobs: queue.Queue[tuple[Any, int]] = queue.Queue()
        self.done: queue.Queue[BaseException | None] = queue.Queue()  # each write's failure
        self.writing = False

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

    def save(self, iteration: int, build: Callable[[], dict[str, Any]]) -> None:
        """Start `iteration`'s snapshot of the sharded state dict `build` returns
        (Checkpointer.snapshot_state): its tensors are copied to the host buffer here, so
        training may change them at once, and the copy to the peer and the write go on in the
        writer thread. The previous one must be done (`wait`)."""
        started = time.monotonic()
        assert not self.writing, "the previous snapshot was not waited for"
        tasd, self.cached_distribution = MCoreTensorAwareStateDict.from_state_dict(
            build(),
            algo=self.algo,
            parallelization_group=parallel_state.get_data_parallel_group(
                with_context_parallel=True
            ),
            cached_metadata=self.cached_distribution,
        )
        self.bytes = self.staging.stage(tasd)
        if self.writer is None:
            # One thread for the job's life: starting a thread per snapshot makes the
            # training thread wait for the new one to take and hand back the GIL.
            self.writer = threading.Thread(target=self._writes, name="snapshot-writer", daemon=True)
            self.writer.start()
        self.writing = True
        self.jobs.put((tasd, iteration))
        self.seconds.append(time.monotonic() - started)

    def _writes(self) -> None:
        while True:
            tasd, iteration = self.jobs.get()
            started, cpu = time.monotonic(), time.thread_time()
            failure: BaseException | None = None
            try:
                self.staging.ready()
                self.manager.write(tasd, iteration)
            except CheckpointingException as err:  # raised on every rank alike (PodMemory)
                if self.rank == 0:
                    log.warning("snapshot of iteration %d skipped: %s", iteration, err)
            except BaseException as err:  # handed to the main thread by wait()
                failure = err
            else:
                self.newest = iteration
            self.writes.append(time.monotonic() - started)
            self.write_cpu.append(time.thread_time() - cpu)
            self.done.put(failure)

    def wait(self) -> float:
        """Wait for the snapshot being written; the seconds waited (part of its stall). Called
        before each step's record, so that a recorded step's previous snapshot is complete:
        a failure then loses at most the step in flight and the one recorded."""
        if not self.writing:
            return 0.0
        started = time.monotonic()
        failure = self.done.get()
        self.writing = False
        waited = time.monotonic() - started
        if self.seconds:
            self.seconds[-1] += waited
        if failure is not None:
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
