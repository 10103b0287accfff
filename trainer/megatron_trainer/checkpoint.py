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

import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.dist_checkpointing.serialization import (
    get_default_load_sharded_strategy,
    get_default_save_sharded_strategy,
)
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue
from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
from megatron.core.dist_checkpointing.strategies.fully_parallel import (
    FullyParallelLoadStrategyWrapper,
    FullyParallelSaveStrategyWrapper,
)

from megatron_contract import paths
from megatron_contract.config import CheckpointConfig, TrainerConfig
from megatron_contract.errors import ConfigError

from . import optim_compat
from .decisions import save_sharding_type
from .flops import flops_per_step
from .interchange import (
    CHECKPOINT_VERSION,
    capture_rng,
    megatron_lm_args,
    restore_rng,
    rng_sharded_object,
)
from .platform import Platform

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
    return Path(root) / paths.iter_dir_name(iteration)


def _iteration_of(path: Path) -> int | None:
    name = path.name
    digits = name[5:]
    if (
        not name.startswith("iter_")
        or not (digits.isascii() and digits.isdigit())
        or len(digits) > 18
    ):
        return None
    return int(name[5:])


def incomplete_reason(path: Path) -> str | None:
    """Why `path` is not a complete checkpoint, or None when it is."""
    for name in ("metadata.json", ".metadata", "common.pt"):
        if not (path / name).is_file():
            return f"{name} is missing (the save was interrupted)"
    from .safe_metadata import read_metadata

    try:  # restricted: a scanned directory's .metadata must not run code (safe_metadata.py)
        metadata = read_metadata(path)
    except Exception as err:  # a truncated pickle raises anything from EOFError to ValueError
        return f".metadata is unreadable ({type(err).__name__}: {err})"
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for relative, size in sorted(needed.items()):
        try:
            actual = (path / relative).stat().st_size
        except FileNotFoundError:
            return f"shard file {relative} is missing"
        if actual < size:
            return f"shard file {relative} is truncated ({actual} of {size} bytes)"
    return None


@dataclass(frozen=True)
class Scan:
    complete: list[int]
    broken: list[tuple[Path, str]]  # incomplete or truncated directories, with the reason


def scan(root: str | Path) -> Scan:
    complete, broken = [], []
    base = Path(root)
    if not base.is_dir():
        return Scan([], [])
    for path in sorted(base.iterdir()):
        iteration = _iteration_of(path)
        if iteration is None or not path.is_dir():
            continue
        reason = incomplete_reason(path)
        if reason is None:
            complete.append(iteration)
        else:
            broken.append((path, reason))
    return Scan(sorted(complete), broken)


def remove_dir(path: Path) -> None:
    """Delete a checkpoint directory so that a kill half-way leaves it looking incomplete."""
    (path / "metadata.json").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def read_tracker(root: str | Path) -> int | None:
    try:
        return int((Path(root) / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def write_tracker(root: str | Path, iteration: int) -> None:
    tmp = Path(root) / f".{TRACKER}.tmp"
    tmp.write_text(f"{iteration}\n")
    os.replace(tmp, Path(root) / TRACKER)  # atomic: readers see the old or the new number


def model_fingerprint(model_json: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model_json.items() if k not in _MUTABLE_MODEL_FIELDS}


def read_loss(path: Path) -> float | None:
    """The training loss recorded with the checkpoint at `path` (None if unknown)."""
    try:
        common = torch.load(path / "common.pt", map_location="cpu", weights_only=True)
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

    def __init__(self, root: Path, keep: int, remove: Callable[[Path], None] | None = None) -> None:
        self.root, self.keep = root, keep
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
        losses = {i: read_loss(iteration_dir(self.root, i)) for i in complete}
        doomed = checkpoints_to_prune(complete, self.keep, losses)
        for iteration in doomed:
            self.remove(iteration_dir(self.root, iteration))
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

    def __init__(self, cfg: TrainerConfig, platform: Platform) -> None:
        self.cfg = cfg
        self.ckpt: CheckpointConfig = cfg.checkpoint
        self.root = Path(cfg.checkpoint.dir)
        self.platform = platform
        self.rank = torch.distributed.get_rank()
        self.async_queue = (
            AsyncCallsQueue(persistent=persistent_async_worker(platform.is_cuda))
            if cfg.checkpoint.async_save
            else None
        )
        self.pruner = Pruner(self.root, cfg.checkpoint.keep) if self.rank == 0 else None
        self.newest: int | None = None  # newest complete checkpoint (for progress reports)
        self.save_strategy: Any = None
        p = cfg.parallelism
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
            self.root.mkdir(parents=True, exist_ok=True)
            found = scan(self.root)
            for path, reason in found.broken:
                log.warning("checkpoint %s is incomplete: %s; deleting it", path, reason)
                remove_dir(path)
            if not self.ckpt.load and found.complete:
                discarded = (
                    self.root / f"discarded-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                )
                log.warning(
                    "checkpoint.load is false: NOT resuming; moving %d existing checkpoint(s) to %s",
                    len(found.complete),
                    discarded,
                )
                discarded.mkdir()
                for iteration in found.complete:
                    os.replace(
                        iteration_dir(self.root, iteration),
                        discarded / iteration_dir("", iteration).name,
                    )
                (self.root / TRACKER).unlink(missing_ok=True)
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
        path = iteration_dir(self.root, iteration)
        if self.rank == 0:
            if path.exists():
                log.warning("replacing existing checkpoint %s", path)
                remove_dir(path)
            path.mkdir(parents=True)
        torch.distributed.barrier()
        started = time.monotonic()
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
        state["args"] = megatron_lm_args(
            self.cfg,
            iteration=iteration,
            consumed_samples=consumed_samples,
            sharding_type=sharding,
            moe_grouped_gemm=bool(getattr(model[0].config, "moe_grouped_gemm", False)),
        )
        state["trainer"] = {
            "formatVersion": FORMAT_VERSION,
            "iteration": iteration,
            "consumedSamples": consumed_samples,
            "globalBatchSize": self.cfg.training.global_batch_size,
            "model": model_fingerprint(self.cfg.model_json),
            "layout": self.layout,
            "shardingType": sharding,
            "jobUid": self.cfg.job.uid,
            "loss": loss,
        }
        use_async = self.async_queue is not None and not blocking
        request = dist_checkpointing.save(
            state,
            str(path),
            sharded_strategy=self._save_strategy(),
            async_sharded_save=use_async,
            content_metadata={
                k: v for k, v in self._metadata(sharding).items() if k != "dp_cp_group"
            },
        )

        def finished() -> None:
            if self.pruner is not None:
                write_tracker(self.root, iteration)
                # Off the critical path: the other ranks are already past this collective.
                self.pruner.submit(iteration)
            self.newest = iteration
            log.info("checkpoint %d complete (%s, %s)", iteration, path, sharding)

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

    def _save_strategy(self) -> Any:
        if self.save_strategy is None:
            strategy = get_default_save_sharded_strategy("torch_dist")
            # Spread the writes of replicated tensors over the DP ranks instead of DP rank 0.
            self.save_strategy = FullyParallelSaveStrategyWrapper(
                strategy, parallel_state.get_data_parallel_group(with_context_parallel=True)
            )
        return self.save_strategy

    def finalize(self, blocking: bool = False) -> None:
        """Finish async saves that are done (all of them if `blocking`). Collective."""
        if self.async_queue is not None:
            self.async_queue.maybe_finalize_async_calls(blocking=blocking)

    def close(self) -> None:
        if self.async_queue is not None:
            self.async_queue.close()
        if self.pruner is not None:
            self.pruner.close()

    # -- load ------------------------------------------------------------------------------

    def load(self, iteration: int, model: list[Any], optimizer: Any, scheduler: Any) -> Resumed:
        path = iteration_dir(self.root, iteration)
        common = TorchCommonLoadStrategy().load_common(path)
        saved = self._check_compatible(common, path)
        saved_layout = saved["layout"]
        # Megatron-LM's rule: the RNG state is per (PP, TP) rank (per DP rank too with EP).
        rng_keys = ("tensor", "pipeline") + (
            ("expert", "data", "context") if (self.layout["expert"] or 1) > 1 else ()
        )
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
        optim_compat.prepare_for_load(optimizer)
        state = self._state_dict(
            model,
            optimizer,
            scheduler,
            sharding_type=saved["shardingType"],
            is_loading=True,
            with_rng=same_rng_layout,
        )
        strategy = get_default_load_sharded_strategy(str(path))
        if self.platform.is_cuda:
            # Each DP rank reads a share of the replicated tensors and broadcasts it to the
            # others. The broadcast stages tensors with `.cuda()`, so CPU ranks read all they need.
            strategy = FullyParallelLoadStrategyWrapper(
                strategy, parallel_state.get_data_parallel_group(with_context_parallel=True)
            )
        loaded = dist_checkpointing.load(state, str(path), sharded_strategy=strategy)
        for key, chunk in _model_keys(model):
            chunk.module.load_state_dict(loaded[key], strict=True)
        optim_compat.load_optimizer_state(optimizer, loaded["optimizer"])
        saved_schedule = loaded["opt_param_scheduler"]
        changes = schedule_changes(saved_schedule, scheduler.state_dict())
        if changes:
            log.warning(
                "RESUME: the learning-rate schedule changed since %s: %s; continuing with this "
                "job's schedule from step %s",
                path,
                "; ".join(changes),
                saved_schedule.get("num_steps"),
            )
        # override_opt_param_scheduler: only the step count comes from the checkpoint.
        scheduler.load_state_dict(saved_schedule)
        if same_rng_layout:
            restore_rng(loaded["rng_state"][0], self.platform)
        return Resumed(
            iteration=int(saved["iteration"]), consumed_samples=int(saved["consumedSamples"])
        )

    def _check_compatible(self, common: Mapping[str, Any], path: Path) -> dict[str, Any]:
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
        gbs = self.cfg.training.global_batch_size
        if saved["globalBatchSize"] != gbs:
            problems.append(
                f"training.globalBatchSize: the checkpoint in {path} used {saved['globalBatchSize']}, "
                f"this job has {gbs}; the global batch size must stay fixed across a resume"
            )
        changed = [k for k in _RESHARD_FIELDS if saved["layout"].get(k) != self.layout[k]]
        if changed and saved["shardingType"] != "fully_reshardable":
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


_SCHEDULE_FIELDS = (
    "max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
    "start_wd", "end_wd", "wd_incr_steps", "wd_incr_style",
)  # fmt: skip


def schedule_changes(saved: Mapping[str, Any], ours: Mapping[str, Any]) -> list[str]:
    """'field: checkpoint -> job' for each OptimizerParamScheduler setting that differs."""
    return [
        f"{key}: {saved.get(key)!r} -> {ours.get(key)!r}"
        for key in _SCHEDULE_FIELDS
        if saved.get(key) != ours.get(key)
    ]


def persistent_async_worker(is_cuda: bool) -> bool:
    """The async-save caller: Megatron-LM 0.16.1 only allows async save with its persistent
    worker (arguments.py disables --async-save without --use-persistent-ckpt-worker): the
    fork-per-save caller can write pinned host buffers that were already freed. The persistent
    worker is a spawned process that calls `torch.cuda.set_device(rank % device_count())`, which
    divides by zero without a GPU, so the CPU platform (no pinned memory, nothing to free early)
    keeps the fork-per-save caller."""
    return is_cuda


def _model_keys(model: list[Any]) -> list[tuple[str, Any]]:
    """Megatron-LM's keys: "model", or "model0", "model1", ... with virtual pipeline stages."""
    if len(model) == 1:
        return [("model", model[0])]
    return [(f"model{i}", chunk) for i, chunk in enumerate(model)]


def _broadcast_int(value: int, platform: Platform) -> int:
    tensor = torch.tensor([value], dtype=torch.int64, device=platform.device)
    torch.distributed.broadcast(tensor, src=0)
    return int(tensor.item())
