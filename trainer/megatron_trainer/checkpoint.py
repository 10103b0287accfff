"""torch_dist checkpoints in the Megatron-LM layout, safe against a SIGKILL at any moment.

    <dir>/latest_checkpointed_iteration.txt   newest checkpoint every rank finished (for tools)
    <dir>/iter_0000100/{common.pt, metadata.json, .metadata, __<rank>_<k>.distcp}

Completeness: Megatron-Core writes `.metadata` only after every rank's shards are written and
`metadata.json` after that, so a directory missing either is a save that was cut off. We also check
that every shard file `.metadata` references exists and is long enough (a truncated copy). Resume
picks the newest complete directory, warns about and deletes the rest, and never trusts a
directory only because the tracker names it.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.serialization import (
    get_default_load_sharded_strategy,
    get_default_save_sharded_strategy,
)
from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)

from megatron_contract import paths
from megatron_contract.config import CheckpointConfig, TrainerConfig, is_msc_url
from megatron_contract.errors import ConfigError

from . import fsdp_checkpoint, optim_compat
from .async_save import abort as abort_writer
from .async_save import writer_queue
from .decisions import SHARDING_DP as SNAPSHOT_SHARDING
from .decisions import one_bucket_as_none, save_sharding_type
from .flops import flops_per_step
from .interchange import (
    CHECKPOINT_VERSION,
    capture_rng,
    megatron_lm_args,
    restore_rng,
    rng_sharded_object,
)
from .platform import Platform
from .storage import storage_for, use_msc

log = logging.getLogger(__name__)

TRACKER = paths.TRACKER_FILE  # the Megatron-LM layout, from the contract
# 2: RNG state in Megatron-LM's layout, Megatron-LM `args`, the step's loss, per-save sharding.
FORMAT_VERSION = 2
# Format 1 stored the RNG state in our own layout: its weights, optimizer and data position load,
# its RNG state is not restored.
READABLE_FORMATS = frozenset({1, 2})
# Model fields that do not change the architecture or the meaning of the data position; they may
# change across a resume. Everything else in `model` must match the checkpoint.
_MUTABLE_MODEL_FIELDS = frozenset({"recipe", "attentionDropout", "hiddenDropout"})
_RESHARD_FIELDS = ("tensor", "pipeline", "virtualPipeline", "expert", "expertTensor")


def iteration_dir(root: str | Path, iteration: int) -> Path:
    """The iteration's directory under a local root (see `iteration_path` for any root)."""
    return Path(root) / paths.iter_dir_name(iteration)


def iteration_path(root: str | Path, iteration: int) -> str:
    """The iteration's directory under `root`: a local path or an msc:// URL."""
    root = str(root)
    return storage_for(root).join(root, paths.iter_dir_name(iteration))


def _iteration_of(name: str) -> int | None:
    digits = name[5:]
    # ASCII digits only: "iter_²" passes str.isdigit, and int() then raises.
    if (
        not name.startswith("iter_")
        or not (digits.isascii() and digits.isdigit())
        or len(digits) > 18
    ):
        return None
    return int(name[5:])


def read_metadata(path: str) -> Any:
    """The torch.distributed.checkpoint `.metadata` of a checkpoint directory or URL, read with a
    restricted unpickler: a scanned directory's .metadata must not run code (safe_metadata.py)."""
    from .safe_metadata import read_metadata as read_safely

    return read_safely(path)


def format_of(path: str | Path) -> str:
    """The format of the iteration directory at `path` (contract: paths.checkpoint_format).
    torch_dist writes common.pt first and metadata.json last; fsdp_dtensor (plain torch DCP)
    writes neither, so a directory with one of them is torch_dist, complete or not."""
    path = str(path)
    store = storage_for(path)
    if any(store.size(store.join(path, n)) is not None for n in ("common.pt", "metadata.json")):
        return paths.TORCH_DIST
    return paths.FSDP_DTENSOR


def incomplete_reason(path: str | Path) -> str | None:
    """Why `path` is not a complete checkpoint (of either format), or None when it is."""
    path = str(path)
    store = storage_for(path)
    names: tuple[str, ...] = ("metadata.json", ".metadata", "common.pt")
    if format_of(path) == paths.FSDP_DTENSOR:
        names = (paths.DCP_METADATA,)  # torch DCP writes it last, once every shard is written
    for name in names:
        if store.size(store.join(path, name)) is None:
            return f"{name} is missing (the save was interrupted)"
    from .safe_metadata import MetadataError

    try:
        metadata = read_metadata(path)
    except MetadataError:
        raise  # refused by policy, not an interrupted save: the scan keeps it (see `scan`)
    except Exception as err:  # a truncated pickle raises anything from EOFError to ValueError
        return f".metadata is unreadable ({type(err).__name__}: {err})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for relative, size in sorted(needed.items()):
        actual = store.size(store.join(path, relative))
        if actual is None:
            return f"shard file {relative} is missing"
        if actual < size:
            return f"shard file {relative} is truncated ({actual} of {size} bytes)"
    return None


@dataclass(frozen=True)
class Scan:
    complete: list[int]
    broken: list[tuple[str, str]]  # incomplete or truncated directories, with the reason
    # Directories whose .metadata the restricted reader refused: never resumed from, and never
    # deleted either (a reader too strict for a real checkpoint once made the scan delete every
    # checkpoint a job had; what we cannot judge is not ours to destroy).
    refused: list[tuple[str, str]] = field(default_factory=list)


def scan(root: str | Path) -> Scan:
    from .safe_metadata import MetadataError

    complete, broken, refused = [], [], []
    root = str(root)
    store = storage_for(root)
    for name in store.names(root):
        iteration = _iteration_of(name)
        path = store.join(root, name)
        if iteration is None or not store.is_dir(path):
            continue
        try:
            reason = incomplete_reason(path)
        except MetadataError as err:
            refused.append((path, str(err)))
            continue
        if reason is None:
            complete.append(iteration)
        else:
            broken.append((path, reason))
    return Scan(sorted(complete), broken, refused)


def remove_dir(path: str | Path) -> None:
    """Delete a checkpoint directory so that a kill half-way leaves it looking incomplete."""
    path = str(path)
    storage_for(path).remove_tree(path)


def read_tracker(root: str | Path) -> int | None:
    root = str(root)
    store = storage_for(root)
    try:
        return int(store.read_bytes(store.join(root, TRACKER)).decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def write_tracker(root: str | Path, iteration: int) -> None:
    """Written last, once the checkpoint is complete: atomic on a filesystem (a rename) and on
    object storage (one PUT), so readers see the old number or the new one."""
    root = str(root)
    store = storage_for(root)
    store.write_atomic(store.join(root, TRACKER), f"{iteration}\n".encode())


# Model fields added after checkpoints were written, with the value they had implicitly then: at
# that value they are left out of the fingerprint, so those checkpoints still resume.
_ADDED_MODEL_FIELDS: dict[str, Any] = {"ropeScaling": None}
_ADDED_MOE_FIELDS: dict[str, Any] = {"routerPreSoftmax": False}


def model_fingerprint(model_json: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        k: v
        for k, v in model_json.items()
        if k not in _MUTABLE_MODEL_FIELDS
        and not (k in _ADDED_MODEL_FIELDS and v == _ADDED_MODEL_FIELDS[k])
    }
    moe = out.get("moe")
    if isinstance(moe, dict):
        out["moe"] = {
            k: v
            for k, v in moe.items()
            if not (k in _ADDED_MOE_FIELDS and v == _ADDED_MOE_FIELDS[k])
        }
    return out


def load_common(path: str | Path) -> dict[str, Any]:
    """The common state of the checkpoint at `path` (a directory or an msc:// URL): common.pt
    of a torch_dist one, the top-level non-tensor entries of an fsdp_dtensor one."""
    path = str(path)
    if format_of(path) == paths.FSDP_DTENSOR:
        return fsdp_checkpoint.read_common(path, read_metadata(path))
    store = storage_for(path)
    data = store.read_bytes(store.join(path, "common.pt"))
    common: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    return common


def read_loss(path: str | Path) -> float | None:
    """The training loss recorded with the checkpoint at `path` (None if unknown)."""
    try:
        common = load_common(path)
    except Exception:  # unreadable or pre-format-2: treat as unknown
        return None
    loss = (common.get("trainer") or {}).get("loss")
    return float(loss) if isinstance(loss, int | float) else None


def checkpoints_to_prune(
    complete: list[int], keep: int, losses: Mapping[int, float | None]
) -> list[int]:
    """Which complete checkpoints to delete so that `keep` newest remain (0 keeps all).

    The newest checkpoint saved with a finite loss is never deleted, even when `keep` newer ones
    exist: if later checkpoints hold a NaN/Inf (or unknown) loss, it is the one to go back to.
    """
    if keep == 0:
        return []
    newest_first = sorted(complete, reverse=True)
    kept = set(newest_first[:keep])
    finite = [i for i in newest_first if _finite(losses.get(i))]
    if finite:
        kept.add(finite[0])
    return sorted(i for i in complete if i not in kept)


def _finite(loss: float | None) -> bool:
    return loss is not None and math.isfinite(loss)


class Pruner:
    """Deletes old checkpoints on rank 0 in a background thread, after a save is complete.

    Deleting a big checkpoint on a network filesystem takes minutes; inside the save's
    finalisation (a collective) every other rank would wait in it, up to the process group's
    10-minute timeout. One worker thread, so prunes run one at a time and in order.
    """

    def __init__(
        self, root: str | Path, keep: int, remove: Callable[[str], None] | None = None
    ) -> None:
        self.root, self.keep = str(root), keep
        self.remove = remove or remove_dir
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-prune")
        self.lock = threading.Lock()
        self.pending: list[Future[list[int]]] = []

    def submit(self, newest: int) -> Future[list[int]]:
        future = self.pool.submit(self._prune, newest)
        with self.lock:
            self.pending = [f for f in self.pending if not f.done()] + [future]
        return future

    def _prune(self, newest: int) -> list[int]:
        complete = [i for i in scan(self.root).complete if i <= newest]
        losses = {i: read_loss(iteration_path(self.root, i)) for i in complete}
        doomed = checkpoints_to_prune(complete, self.keep, losses)
        for iteration in doomed:
            self.remove(iteration_path(self.root, iteration))
        if doomed:
            log.info("pruned checkpoint(s) %s (keep %d)", doomed, self.keep)
        return doomed

    def wait(self) -> None:
        with self.lock:
            pending = list(self.pending)
        for future in pending:
            try:
                future.result()
            except Exception as err:  # pruning is housekeeping: never fail the job for it
                log.warning("pruning checkpoints failed: %s", err)

    def close(self) -> None:
        self.wait()
        self.pool.shutdown(wait=True)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resumed:
    iteration: int
    consumed_samples: int


class Checkpointer:
    """Save/load for one rank. Every method is collective: all ranks call it at the same point."""

    def __init__(self, cfg: TrainerConfig, platform: Platform, local_rank: int = 0) -> None:
        self.cfg = cfg
        self.ckpt: CheckpointConfig = cfg.checkpoint
        self.root = cfg.checkpoint.dir  # a directory or an msc:// URL
        self.storage = storage_for(self.root)
        use_msc(self.root)
        self.platform = platform
        self.rank = torch.distributed.get_rank()
        # Megatron FSDP's fsdp_dtensor saves are synchronous (torch DCP), as in Megatron-LM.
        async_save = cfg.checkpoint.async_save and not cfg.parallelism.fsdp
        self.async_queue = writer_queue(local_rank, platform.is_cuda) if async_save else None
        self.pruner = Pruner(self.root, cfg.checkpoint.keep) if self.rank == 0 else None
        self.newest: int | None = None  # newest complete checkpoint (for progress reports)
        self.save_strategy: Any = None
        p = cfg.parallelism
        self.fsdp = p.fsdp
        self.format = paths.checkpoint_format(p.fsdp)
        self.layout = {
            "tensor": p.tensor,
            "pipeline": p.pipeline,
            "virtualPipeline": p.virtual_pipeline,
            "context": p.context,
            "expert": p.expert,
            "expertTensor": p.expert_tensor,
            "data": p.data,
        }

    # -- discovery -------------------------------------------------------------------------

    def find_resume_point(self) -> int | None:
        """Newest complete checkpoint to resume from (None = start from scratch), same on all ranks.

        Rank 0 scans, logs loudly what it found and why it skips anything, deletes broken
        directories, and broadcasts its choice.
        """
        choice = -1
        if self.rank == 0:
            self.storage.makedirs(self.root)
            found = scan(self.root)
            for path, reason in found.broken:
                log.warning("checkpoint %s is incomplete: %s; deleting it", path, reason)
                remove_dir(path)
            for path, reason in found.refused:
                log.warning("checkpoint %s is skipped, not deleted: %s", path, reason)
            if not self.ckpt.load and found.complete:
                self._discard(found.complete)
            elif found.complete:
                choice = found.complete[-1]
                tracker = read_tracker(self.root)
                if tracker != choice:
                    log.warning(
                        "%s says %s but the newest complete checkpoint is %d; using %d",
                        TRACKER,
                        tracker,
                        choice,
                        choice,
                    )
        choice = _broadcast_int(choice, self.platform)
        self.newest = choice if choice >= 0 else None
        return self.newest

    def _discard(self, complete: list[int]) -> None:
        """checkpoint.load false: keep the old checkpoints aside instead of resuming from them."""
        if is_msc_url(self.root):
            raise ConfigError(
                [
                    f"checkpoint.load: false with object storage ({self.root}) would have to copy "
                    "every old checkpoint aside; point checkpoint.url at an empty prefix instead"
                ]
            )
        root = Path(self.root)
        discarded = root / f"discarded-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        log.warning(
            "checkpoint.load is false: NOT resuming; moving %d existing checkpoint(s) to %s",
            len(complete),
            discarded,
        )
        discarded.mkdir()
        for iteration in complete:
            os.replace(iteration_dir(root, iteration), discarded / paths.iter_dir_name(iteration))
        (root / TRACKER).unlink(missing_ok=True)

    # -- state dicts -----------------------------------------------------------------------

    def _metadata(self, sharding_type: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            # Explicit: 0.16.1's default (fully_sharded_model_space) fails metadata validation.
            "distrib_optim_sharding_type": sharding_type,
            "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True,
            "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
        }
        if not self.platform.is_cuda:
            # fully_reshardable gathers the optimizer state to DP rank 0 with `.cuda()` tensors
            # unless its memory-efficient variant is chosen, which gathers CPU tensors over the
            # gloo group instead. Same checkpoint content; the only variant that runs on CPU.
            metadata["distrib_optim_fully_reshardable_mem_efficient"] = True
        return metadata

    def _state_dict(
        self,
        model: list[Any],
        optimizer: Any,
        scheduler: Any,
        *,
        sharding_type: str,
        is_loading: bool,
        with_rng: bool,
    ) -> dict[str, Any]:
        """Megatron-LM's `generate_state_dict` layout (model/modelN, optimizer,
        opt_param_scheduler, rng_state), so either side can load the other's checkpoint."""
        metadata = self._metadata(sharding_type)
        state: dict[str, Any] = {}
        # Below DDP (which has no sharded_state_dict of its own), so keys read
        # "decoder.layers.0...." as in Megatron-LM's checkpoints, not "module.decoder...".
        for key, chunk in _model_keys(model):
            state[key] = chunk.module.sharded_state_dict(metadata=metadata)
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=is_loading, metadata=metadata
        )
        state["opt_param_scheduler"] = scheduler.state_dict()
        if with_rng:
            state["rng_state"] = rng_sharded_object(
                None if is_loading else [capture_rng(self.platform)]
            )
        return state

    # -- save ------------------------------------------------------------------------------

    def save(
        self,
        iteration: int,
        consumed_samples: int,
        model: list[Any],
        optimizer: Any,
        scheduler: Any,
        *,
        blocking: bool = False,
        loss: float | None = None,
    ) -> None:
        """Save `iteration`. Async when configured and not `blocking` (the final save of a run:
        SIGTERM or the last iteration). `loss` is the step's training loss, kept for pruning."""
        if self.async_queue is not None:
            # One save in flight at a time, so the tracker always moves forward.
            self.async_queue.maybe_finalize_async_calls(blocking=True)
        path = iteration_path(self.root, iteration)
        if self.rank == 0:
            if self.storage.exists(path):
                log.warning("replacing existing checkpoint %s", path)
                remove_dir(path)
            self.storage.makedirs(path)
        torch.distributed.barrier()
        started = time.monotonic()
        if self.fsdp:
            self._save_fsdp(path, iteration, consumed_samples, model, optimizer, scheduler, loss)
            self._finished(iteration, path, paths.FSDP_DTENSOR)
            log.info("checkpoint %d saved in %.2fs", iteration, time.monotonic() - started)
            return
        if model[0].ddp_config.overlap_param_gather:
            # With the overlapped all-gather, this rank's parameters are only gathered in the
            # next forward pass; save the updated ones (Megatron-LM's force_param_sync).
            for chunk in model:
                chunk.start_param_sync(force_sync=True)
        sharding = save_sharding_type(self.ckpt.sharding_type, final=blocking)
        state = self._state_dict(
            model, optimizer, scheduler, sharding_type=sharding, is_loading=False, with_rng=True
        )
        state["iteration"] = iteration
        state["checkpoint_version"] = CHECKPOINT_VERSION
        # Megatron-LM's running FLOP count (it reads it with a default of 0).
        state["num_floating_point_operations_so_far"] = iteration * flops_per_step(
            self.cfg.model, self.cfg.training.global_batch_size
        )
        state["args"] = self._args(model, iteration, consumed_samples, sharding)
        state["trainer"] = self._record(model, iteration, consumed_samples, sharding, loss)
        use_async = self.async_queue is not None and not blocking
        request = dist_checkpointing.save(
            state,
            path,
            sharded_strategy=self._save_strategy(),
            async_sharded_save=use_async,
            content_metadata={
                k: v for k, v in self._metadata(sharding).items() if k != "dp_cp_group"
            },
        )

        def finished() -> None:
            self._finished(iteration, path, sharding)

        if use_async:
            assert request is not None and self.async_queue is not None
            request.add_finalize_fn(finished)
            self.async_queue.schedule_async_request(request)
            log.info(
                "checkpoint %d: async save started (%.2fs stall)",
                iteration,
                time.monotonic() - started,
            )
        else:
            finished()
            log.info("checkpoint %d saved in %.2fs", iteration, time.monotonic() - started)

    def _args(self, model: list[Any], iteration: int, consumed: int, sharding: str) -> Any:
        return megatron_lm_args(
            self.cfg,
            iteration=iteration,
            consumed_samples=consumed,
            sharding_type=sharding,
            moe_grouped_gemm=bool(getattr(model[0].config, "moe_grouped_gemm", False)),
            ddp=model[0].ddp_config,
        )

    def _record(
        self, model: list[Any], iteration: int, consumed: int, sharding: str, loss: float | None
    ) -> dict[str, Any]:
        """Our own record of a checkpoint (`trainer` in its common state)."""
        ddp = model[0].ddp_config
        return {
            "formatVersion": FORMAT_VERSION,
            "iteration": iteration,
            "consumedSamples": consumed,
            "globalBatchSize": self.cfg.training.global_batch_size,
            "model": model_fingerprint(self.cfg.model_json),
            "layout": self.layout,
            "shardingType": sharding,
            "checkpointFormat": self.format,
            "jobUid": self.cfg.job.uid,
            "loss": loss,
            "precision": self.cfg.training.precision,
            # The dp_reshardable optimizer state is per bucket: a resume builds the same ones.
            "bucketSize": None if self.fsdp else one_bucket_as_none(ddp.bucket_size),
        }

    def _fsdp_state(
        self, model: list[Any], optimizer: Any, scheduler: Any, *, is_loading: bool, rng: bool
    ) -> dict[str, Any]:
        """Megatron-LM's fsdp_dtensor state dict of this rank (fsdp_checkpoint.py)."""
        pp = parallel_state.get_pipeline_model_parallel_rank()
        tp = parallel_state.get_tensor_model_parallel_rank()
        return fsdp_checkpoint.state_dict(
            _model_keys(model),
            optimizer,
            scheduler,
            args=None,
            iteration=0,
            rng_key=f"({pp}, {tp})",
            rng=[capture_rng(self.platform)] if rng else None,
            dp_cp_group=parallel_state.get_data_parallel_group(with_context_parallel=True),
            is_loading=is_loading,
        )

    def _fsdp_preprocess(self, state: dict[str, Any], model: list[Any]) -> dict[str, Any]:
        m = self.cfg.model
        num_experts = m.moe.num_experts if m.moe is not None else None
        # Megatron-LM passes `unwrap_model(model)[0]`, which stops at MegatronFSDP (the
        # adapter's `module`): its `get_parameter("module." + key)` resolves the state dict's keys.
        preprocessed: dict[str, Any] = fsdp_checkpoint.preprocess(
            state, model[0].module, m.activation == "swiglu", num_experts
        )
        return preprocessed

    def _save_fsdp(
        self,
        path: str,
        iteration: int,
        consumed_samples: int,
        model: list[Any],
        optimizer: Any,
        scheduler: Any,
        loss: float | None,
    ) -> None:
        """Megatron-LM's fsdp_dtensor save: no parameter sync first (each rank saves its own
        shards), synchronous (torch DCP), every entry in DCP."""
        state = self._fsdp_state(model, optimizer, scheduler, is_loading=False, rng=True)
        state["iteration"] = iteration
        state["args"] = self._args(model, iteration, consumed_samples, paths.FSDP_DTENSOR)
        record = self._record(model, iteration, consumed_samples, paths.FSDP_DTENSOR, loss)
        state[fsdp_checkpoint.TRAINER_KEY] = json.dumps(record)
        state["num_floating_point_operations_so_far"] = iteration * flops_per_step(
            self.cfg.model, self.cfg.training.global_batch_size
        )
        fsdp_checkpoint.save(self._fsdp_preprocess(state, model), path)

    def _load_fsdp(
        self, path: str, model: list[Any], optimizer: Any, scheduler: Any, rng: bool
    ) -> dict[str, Any]:
        """Megatron-LM's fsdp_dtensor load (checkpointing.py `_load_base_checkpoint` and
        `load_checkpoint`); returns the loaded scheduler state and RNG state."""
        optim_compat.prepare_for_load(optimizer)
        state = self._fsdp_state(model, optimizer, scheduler, is_loading=True, rng=rng)
        keys = _model_keys(model)
        raw_model = {key: state[key].copy() for key, _ in keys}
        raw_optimizer = state["optimizer"].copy()
        loaded = self._fsdp_preprocess(state, model)
        fsdp_checkpoint.load(loaded, path)
        # The split SwiGLU halves loaded into views of the unsplit tensors: load those.
        for key, chunk in keys:
            chunk.load_state_dict(raw_model[key], strict=True)
        optim_compat.load_optimizer_state(optimizer, raw_optimizer)
        return loaded

    def _save_strategy(self) -> Any:
        if self.save_strategy is None:
            strategy = get_default_save_sharded_strategy("torch_dist")
            # Spread the writes of replicated tensors over the DP ranks instead of DP rank 0.
            self.save_strategy = FullyParallelSaveStrategyWrapper(
                strategy, parallel_state.get_data_parallel_group(with_context_parallel=True)
            )
        return self.save_strategy

    def _finished(self, iteration: int, path: str, sharding: str) -> None:
        if self.pruner is not None:
            write_tracker(self.root, iteration)
            # Off the critical path: the other ranks are already past this collective.
            self.pruner.submit(iteration)
        self.newest = iteration
        log.info("checkpoint %d complete (%s, %s)", iteration, path, sharding)

    def finalize(self, blocking: bool = False) -> None:
        """Finish async saves that are done (all of them if `blocking`). Collective."""
        if self.async_queue is not None:
            self.async_queue.maybe_finalize_async_calls(blocking=blocking)

    def close(self) -> None:
        if self.async_queue is not None:
            self.async_queue.close()
        if self.pruner is not None:
            self.pruner.close()

    def abort(self) -> None:
        """On an error exit: kill the async writer (a save in flight stays incomplete) and
        leave pending prunes to die with the process. Not collective."""
        if self.async_queue is not None:
            abort_writer(self.async_queue)
        if self.pruner is not None:
            self.pruner.pool.shutdown(wait=False, cancel_futures=True)

    # -- load ------------------------------------------------------------------------------

    def load(self, iteration: int, model: list[Any], optimizer: Any, scheduler: Any) -> Resumed:
        path = iteration_path(self.root, iteration)
        if format_of(path) == paths.FSDP_DTENSOR:
            common = load_common(path)
        else:
            # A Path for a directory: Megatron-Core lists it (Path.iterdir) when common.pt is
            # missing.
            common = TorchCommonLoadStrategy().load_common(path if is_msc_url(path) else Path(path))
        saved = self._check_compatible(common, path)
        saved_layout = saved["layout"]
        # Megatron-LM's rule: the RNG state is per (PP, TP) rank (per DP rank too with EP),
        # so it is sharded differently when either side has EP > 1 (from EP 2 to 1 the load
        # asked for the unsharded one, and failed).
        with_ep = max(saved_layout.get("expert") or 1, self.layout["expert"] or 1) > 1
        rng_keys = ("tensor", "pipeline") + (("expert", "data", "context") if with_ep else ())
        same_rng_layout = all(saved_layout.get(k) == self.layout[k] for k in rng_keys)
        if saved["formatVersion"] < FORMAT_VERSION:
            log.warning("%s has checkpoint format %s: RNG states are not restored", path,
                        saved["formatVersion"])  # fmt: skip
            same_rng_layout = False
        elif not same_rng_layout:
            log.warning(
                "layout changed since %s (%s -> %s): RNG states are not restored (they are per "
                "rank); data order, weights and optimizer state are",
                path,
                saved_layout,
                self.layout,
            )
        if self.fsdp:
            loaded = self._load_fsdp(path, model, optimizer, scheduler, rng=same_rng_layout)
            apply_schedule(loaded["opt_param_scheduler"], scheduler, optimizer, path)
            if same_rng_layout:
                (rng,) = loaded["rng_state"].values()
                restore_rng(rng[0], self.platform)
            return Resumed(
                iteration=int(saved["iteration"]), consumed_samples=int(saved["consumedSamples"])
            )
        optim_compat.prepare_for_load(optimizer)
        state = self._state_dict(
            model,
            optimizer,
            scheduler,
            sharding_type=saved["shardingType"],
            is_loading=True,
            with_rng=same_rng_layout,
        )
        strategy = get_default_load_sharded_strategy(path)
        if self.platform.is_cuda:
            # Each DP rank reads a share of the replicated tensors and broadcasts it to the
            # others. The broadcast stages tensors with `.cuda()`, so CPU ranks read all they need.
            strategy = FullyParallelLoadStrategyWrapper(
                strategy, parallel_state.get_data_parallel_group(with_context_parallel=True)
            )
        loaded = dist_checkpointing.load(state, path, sharded_strategy=strategy)
        self.apply(loaded, model, optimizer, scheduler, path, same_rng_layout)
        return Resumed(
            iteration=int(saved["iteration"]), consumed_samples=int(saved["consumedSamples"])
        )

    def apply(
        self,
        loaded: dict[str, Any],
        model: list[Any],
        optimizer: Any,
        scheduler: Any,
        source: str,
        rng: bool,
    ) -> None:
        """A loaded state dict (of `state_dict` with is_loading) into the model, optimizer,
        schedule and RNG."""
        for key, chunk in _model_keys(model):
            chunk.module.load_state_dict(loaded[key], strict=True)
        optim_compat.load_optimizer_state(optimizer, loaded["optimizer"])
        apply_schedule(loaded["opt_param_scheduler"], scheduler, optimizer, source)
        if rng:
            restore_rng(loaded["rng_state"][0], self.platform)

    def load_template(self, model: list[Any], optimizer: Any, scheduler: Any) -> dict[str, Any]:
        """The state dict a snapshot loads into (its layout: snapshots.SNAPSHOT_SHARDING)."""
        optim_compat.prepare_for_load(optimizer)
        return self._state_dict(
            model, optimizer, scheduler, sharding_type=SNAPSHOT_SHARDING, is_loading=True,
            with_rng=True,
        )  # fmt: skip

    def snapshot_state(
        self,
        iteration: int,
        consumed_samples: int,
        model: list[Any],
        optimizer: Any,
        scheduler: Any,
        loss: float | None,
    ) -> dict[str, Any]:
        """`iteration`'s state as a torch_dist save would write it, in the snapshot layout."""
        if model[0].ddp_config.overlap_param_gather:
            for chunk in model:
                chunk.start_param_sync(force_sync=True)
        state = self._state_dict(
            model, optimizer, scheduler, sharding_type=SNAPSHOT_SHARDING, is_loading=False,
            with_rng=True,
        )  # fmt: skip
        state["iteration"] = iteration
        state["checkpoint_version"] = CHECKPOINT_VERSION
        state["trainer"] = self._record(model, iteration, consumed_samples, SNAPSHOT_SHARDING, loss)
        return state

    def _check_compatible(self, common: Mapping[str, Any], path: str) -> dict[str, Any]:
        """ConfigError (exit 78) when this job cannot continue from the checkpoint at `path`."""
        saved = common.get("trainer")
        if not isinstance(saved, dict) or saved.get("formatVersion") not in READABLE_FORMATS:
            raise ConfigError(
                [
                    f"checkpoint.dir: {path} was not written by this trainer (formats "
                    f"{sorted(READABLE_FORMATS)}); point checkpoint.dir at an empty directory or "
                    "at this job's own checkpoints"
                ]
            )
        problems = []
        ours = model_fingerprint(self.cfg.model_json)
        theirs = saved["model"]
        for key in sorted(set(ours) | set(theirs)):
            if ours.get(key) != theirs.get(key):
                problems.append(
                    f"model.{key}: the checkpoint in {path} was trained with "
                    f"{theirs.get(key)!r}, this job has {ours.get(key)!r}"
                )
        if problems:
            problems.append(
                "a checkpoint from a different model cannot be resumed: restore the model "
                "settings, or use a new checkpoint.dir"
            )
        problems += precision_problems(common, self.cfg.training.precision, path)
        gbs = self.cfg.training.global_batch_size
        if saved["globalBatchSize"] != gbs:
            problems.append(
                f"training.globalBatchSize: the checkpoint in {path} used {saved['globalBatchSize']}, "
                f"this job has {gbs}; the global batch size must stay fixed across a resume"
            )
        saved_format = saved.get("checkpointFormat", paths.TORCH_DIST)
        if saved_format != self.format:
            problems.append(
                f"parallelism.fsdp: the checkpoint in {path} is in the {saved_format} format, "
                f"this job saves {self.format} (Megatron FSDP saves fsdp_dtensor, everything "
                "else torch_dist) and neither loads into the other: set parallelism.fsdp back "
                f"to {str(saved_format == paths.FSDP_DTENSOR).lower()}, or use a new "
                "checkpoint.dir (checkpoint.init.megatron with load: weights reads a torch_dist "
                "checkpoint's weights into any layout)"
            )
        saved_ep, ep = saved["layout"].get("expert") or 1, self.layout["expert"] or 1
        if (saved_ep > 1) != (ep > 1):
            problems.append(
                f"parallelism.expert: the checkpoint in {path} was saved with expert={saved_ep}, "
                f"this job has expert={ep}. With expert parallelism the experts have an optimizer "
                "of their own (Megatron-Core chains two), without it they share the dense one, "
                "so the optimizer state does not load across that change: keep expert above 1 "
                "(its size may change with checkpoint.shardingType: fully_reshardable), or start "
                "a new checkpoint.dir from these weights (checkpoint.init.megatron, load: weights)"
            )
        changed = [k for k in _RESHARD_FIELDS if saved["layout"].get(k) != self.layout[k]]
        if changed and saved_format == paths.FSDP_DTENSOR == self.format:
            old = ", ".join(f"{k}={saved['layout'].get(k)}" for k in changed)
            new = ", ".join(f"{k}={self.layout[k]}" for k in changed)
            problems.append(
                f"parallelism: the checkpoint in {path} was saved by Megatron FSDP with {old}; "
                f"this job has {new}. An fsdp_dtensor checkpoint resumes here at a new "
                "parallelism.data only (resharding it over tensor or expert ranks is not "
                "tested): resume with the old layout"
            )
        elif changed and saved["shardingType"] != "fully_reshardable":
            old = ", ".join(f"{k}={saved['layout'].get(k)}" for k in changed)
            new = ", ".join(f"{k}={self.layout[k]}" for k in changed)
            problems.append(
                f"parallelism: the checkpoint in {path} was saved with {old} and "
                f"checkpoint.shardingType {saved['shardingType']!r}, which can only change "
                f"parallelism.data; this job has {new}. Resume with the old layout, or save with "
                "checkpoint.shardingType: fully_reshardable before changing tensor/pipeline/expert"
            )
        if problems:
            raise ConfigError(problems)
        return dict(saved)


# Precisions whose parameters (and so checkpointed weights and optimizer state) share a dtype:
# fp8 keeps bf16 parameters and computes in fp8 inside TE's layers.
_PARAM_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}


def saved_precision(common: Mapping[str, Any]) -> str | None:
    """training.precision of the run that saved `common` (ours records it; before that, and in
    Megatron-LM's checkpoints, it follows from `args`), or None when unknown."""
    trainer = common.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("precision"), str):
        return str(trainer["precision"])
    args = common.get("args")
    if args is None:
        return None
    if getattr(args, "fp8", None):
        return "fp8"
    if getattr(args, "bf16", False):
        return "bf16"
    return "fp16" if getattr(args, "fp16", False) else "fp32"


def precision_problems(common: Mapping[str, Any], precision: str, path: Any) -> list[str]:
    """A resume cannot change the parameter dtype: the optimizer's main parameters and the
    Float16Module wrapping differ (Megatron-Core raises deep in the load). fp8 ↔ bf16 is fine."""
    saved = saved_precision(common)
    if saved is None or _PARAM_DTYPE.get(saved) == _PARAM_DTYPE.get(precision):
        return []
    return [
        f"training.precision: the checkpoint in {path} was trained in {saved}, this job has "
        f"{precision}; a resume keeps the parameter dtype: set training.precision back to "
        f"{saved}, or use a new checkpoint.dir"
    ]


_SCHEDULE_FIELDS = (
    "max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
    "start_wd", "end_wd", "wd_incr_steps", "wd_incr_style",
)  # fmt: skip


def apply_schedule(saved: Mapping[str, Any], scheduler: Any, optimizer: Any, path: Any) -> None:
    """Continue with this job's learning-rate schedule at the checkpoint's step.

    Only the step count comes from the checkpoint (override_opt_param_scheduler). The loaded
    optimizer's param groups carry the checkpoint's `max_lr`/`min_lr`, which Megatron-Core's
    `get_lr` prefers to the scheduler's, so they are set to this job's first: without that a
    changed `lr`/`minLr` would be logged but not applied."""
    ours = scheduler.state_dict()
    changes = schedule_changes(saved, ours)
    if changes:
        log.warning(
            "RESUME: the learning-rate schedule changed since %s: %s; continuing with this "
            "job's schedule from step %s",
            path,
            "; ".join(changes),
            saved.get("num_steps"),
        )
    for group in optimizer.param_groups:
        group["max_lr"], group["min_lr"] = scheduler.max_lr, scheduler.min_lr
    scheduler.load_state_dict(saved)


def schedule_changes(saved: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """'field: checkpoint -> job' for each OptimizerParamScheduler setting that differs."""
    return [
        f"{key}: {saved.get(key)!r} -> {ours.get(key)!r}"
        for key in _SCHEDULE_FIELDS
        if saved.get(key) != ours.get(key)
    ]


def _model_keys(model: list[Any]) -> list[tuple[str, Any]]:
    """Megatron-LM's keys: "model", or "model0", "model1", ... with virtual pipeline stages."""
    if len(model) == 1:
        return [("model", model[0])]
    return [(f"model{i}", chunk) for i, chunk in enumerate(model)]


def _broadcast_int(value: int, platform: Platform) -> int:
    tensor = torch.tensor([value], dtype=torch.int64, device=platform.device)
    torch.distributed.broadcast(tensor, src=0)
    return int(tensor.item())
