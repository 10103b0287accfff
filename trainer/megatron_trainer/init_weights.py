"""`checkpoint.init.megatron`: start a job from a Megatron-LM / NeMo torch_dist checkpoint.

The checkpoint is read with Megatron-Core's dist_checkpointing against this job's own
`sharded_state_dict`, so it reshards on load: any tensor/pipeline/virtual-pipeline layout of the
source fits any layout here (weights are stored as global tensors).

`load: weights` reads only the model. `load: full` also reads the optimizer and LR-scheduler state
and reports the source's iteration and data position, as far as the layout allows: optimizer state
saved `dp_reshardable` only loads at the source's tensor and pipeline sizes (Megatron-Core's rule).

Accepted paths:
- a checkpoint directory with `latest_checkpointed_iteration.txt` (Megatron-LM's tracker; its
  number, or `release`, names the subdirectory to read);
- an iteration directory itself (with `metadata.json`);
- a NeMo 2 checkpoint directory, whose torch_dist weights are in `weights/` with keys under
  `module.` (read-only support by layout; not exercised here, as no NeMo checkpoint is at hand).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_contract.config import is_msc_url
from megatron_contract.errors import ConfigError

from .hf import unwrap

LOAD_MODES = ("weights", "full")
FIELD = "checkpoint.init.megatron"
# Key of one model tensor every GPT checkpoint has; what precedes it is the checkpoint's prefix.
_PROBE_KEY = "decoder.final_layernorm.weight"


@dataclass(frozen=True)
class InitPoint:
    """What a `load_megatron_weights` call read."""

    path: str  # the iteration directory (a local path or an msc:// URL)
    iteration: int | None  # the source's iteration (None: unknown, e.g. a `release` checkpoint)
    consumed_samples: int | None  # the source's data position (None: unknown)


def resolve_checkpoint(path: str | Path) -> str:
    """The complete torch_dist directory `path` names (a directory or an msc:// URL).
    ConfigError naming the field otherwise."""
    from .checkpoint import TRACKER, incomplete_reason, iteration_path
    from .storage import storage_for

    root = str(path)
    store = storage_for(root)
    if not store.is_dir(root):
        raise ConfigError([f"{FIELD}.path: {root} is not a directory (is the volume mounted?)"])
    tracker = store.join(root, TRACKER)
    if store.size(tracker) is not None:
        text = store.read_bytes(tracker).decode(errors="replace").strip()
        if text == "release":
            chosen = store.join(root, "release")
        elif text.isascii() and text.isdigit() and len(text) <= 18:
            chosen = iteration_path(root, int(text))
        else:
            raise ConfigError([f"{FIELD}.path: {tracker} holds {text!r}, not an iteration"])
    elif store.size(store.join(root, "weights", "metadata.json")) is not None:
        chosen = store.join(root, "weights")  # NeMo 2
    elif store.size(store.join(root, "metadata.json")) is not None:
        chosen = root
    else:
        raise ConfigError(
            [f"{FIELD}.path: {root} is not a torch_dist checkpoint: it has neither {TRACKER} "
             "(a checkpoint directory) nor metadata.json (an iteration directory)"]
        )  # fmt: skip
    if not store.is_dir(chosen):
        name = chosen.rstrip("/").rsplit("/", 1)[-1]
        raise ConfigError([f"{FIELD}.path: {tracker} names {name}, which is missing"])
    reason = incomplete_reason(chosen)
    if reason is not None:
        raise ConfigError([f"{FIELD}.path: {chosen} is not a complete checkpoint: {reason}"])
    return chosen


def key_prefix(path: str | Path) -> str:
    """The prefix of the model keys in the checkpoint: "" (Megatron-LM) or "module." (NeMo)."""
    from .checkpoint import read_metadata

    keys: dict[str, Any] = read_metadata(str(path)).state_dict_metadata
    for key in keys:
        if key.endswith(_PROBE_KEY):
            return key[: -len(_PROBE_KEY)]
    raise ConfigError(
        [f"{FIELD}.path: {path} holds no GPT model weights (no {_PROBE_KEY}); is it a "
         "Megatron-Core GPT checkpoint in torch_dist format?"]
    )  # fmt: skip


def _model_keys(model_chunks: list[Any]) -> list[tuple[str, Any]]:
    """Megatron-LM's top-level keys: "model", or "model0", "model1", ... with virtual stages."""
    if len(model_chunks) == 1:
        return [("model", model_chunks[0])]
    return [(f"model{i}", chunk) for i, chunk in enumerate(model_chunks)]


def _model_state(chunk: Any, prefix: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """The chunk's sharded state dict, without Transformer Engine's `_extra_state` (FP8
    scaling history: not weights, and absent from checkpoints saved without TE)."""
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding

    state = {
        k: v
        for k, v in unwrap(chunk).sharded_state_dict(metadata=metadata).items()
        if not k.endswith("_extra_state")
    }
    if prefix:
        replace_prefix_for_sharding(state, "", prefix)
    return state


def _source_position(common: dict[str, Any]) -> tuple[int | None, int | None]:
    """(iteration, consumed samples) from our `trainer` record or Megatron-LM's `args`."""
    iteration = common.get("iteration")
    trainer = common.get("trainer")
    if isinstance(trainer, dict) and "consumedSamples" in trainer:
        return int(trainer["iteration"]), int(trainer["consumedSamples"])
    args = common.get("args")
    consumed = getattr(args, "consumed_train_samples", None)
    return (
        int(iteration) if isinstance(iteration, int) else None,
        int(consumed) if isinstance(consumed, int) else None,
    )


def load_megatron_weights(
    model_chunks: list[Any],
    path: str | Path,
    load: str = "weights",
    *,
    optimizer: Any = None,
    scheduler: Any = None,
) -> InitPoint:
    """Fill this rank's model chunks (DDP-wrapped or bare GPTModels) from the torch_dist
    checkpoint at `path`; with `load="full"` also `optimizer` and `scheduler`. Collective: every
    rank calls it. Call before building the optimizer, or with `load="weights"` call the
    optimizer's `reload_model_params()` afterwards (the distributed optimizer keeps fp32 main
    copies of the weights). Every problem is a ConfigError (exit 78) naming the field.
    """
    if load not in LOAD_MODES:
        raise ConfigError([f"{FIELD}.load: {load!r} is not one of: {', '.join(LOAD_MODES)}"])
    if load == "full" and (optimizer is None or scheduler is None):
        raise ValueError("load='full' needs the optimizer and the scheduler")
    import torch
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import CheckpointingException
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    from .storage import use_msc

    use_msc(str(path))  # the caller switches back to its own checkpoint.dir's setting
    chosen = resolve_checkpoint(path)
    prefix = key_prefix(chosen)
    common = TorchCommonLoadStrategy().load_common(chosen if is_msc_url(chosen) else Path(chosen))
    common = common if isinstance(common, dict) else {}
    content = dist_checkpointing.load_content_metadata(str(chosen)) or {}
    # Our sharded state dicts must be described the way the source was written.
    metadata: dict[str, Any] = dict(content)
    first = next(iter(unwrap(model_chunks[0]).parameters()))
    if load == "full":
        from megatron.core import parallel_state

        from . import optim_compat

        _check_full_load(common, content, prefix, chosen, _precision_of(first))
        metadata["dp_cp_group"] = parallel_state.get_data_parallel_group(with_context_parallel=True)
        if not first.is_cuda:
            # As checkpoint.py: the only fully_reshardable variant that runs on CPU (it gathers
            # over gloo instead of with `.cuda()`); same checkpoint content.
            metadata["distrib_optim_fully_reshardable_mem_efficient"] = True
    state: dict[str, Any] = {
        key: _model_state(chunk, prefix, metadata) for key, chunk in _model_keys(model_chunks)
    }
    if load == "full":
        optim_compat.prepare_for_load(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True, metadata=metadata)
    strategy = get_default_load_sharded_strategy(str(chosen))
    if first.is_cuda:
        from megatron.core import parallel_state
        from megatron.core.dist_checkpointing.strategies.fully_parallel import (
            FullyParallelLoadStrategyWrapper,
        )

        # Each DP rank reads a share and broadcasts it (CUDA only: it stages with `.cuda()`).
        strategy = FullyParallelLoadStrategyWrapper(
            strategy, parallel_state.get_data_parallel_group(with_context_parallel=True)
        )
    try:
        loaded = dist_checkpointing.load(state, str(chosen), sharded_strategy=strategy)
    except (CheckpointingException, KeyError, ValueError, RuntimeError) as err:
        # Missing keys or mismatched global shapes: a checkpoint of another architecture.
        raise _incompatible(chosen, err) from err
    with torch.no_grad():
        for key, chunk in _model_keys(model_chunks):
            missing, unexpected = unwrap(chunk).load_state_dict(loaded[key], strict=False)
            weights_missing = [k for k in missing if not k.endswith("_extra_state")]
            if weights_missing or unexpected:
                raise ConfigError(
                    [f"{FIELD}.path: {chosen} does not fit this model (missing "
                     f"{weights_missing[:5]}, unexpected {list(unexpected)[:5]})"]
                )  # fmt: skip
    iteration, consumed = _source_position(common)
    if load == "full":
        from .checkpoint import apply_schedule

        optim_compat.load_optimizer_state(optimizer, loaded["optimizer"])
        apply_schedule(common["opt_param_scheduler"], scheduler, optimizer, chosen)
    return InitPoint(chosen, iteration, consumed)


def _precision_of(param: Any) -> str:
    """This job's training.precision as far as the parameters show it (fp8 keeps bf16 ones)."""
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(param.dtype, "fp32")


def source_layout(common: dict[str, Any]) -> tuple[int | None, int | None]:
    """(tensor, pipeline) sizes the source was saved at: our `trainer` record or Megatron-LM's
    `args`; None where unknown."""
    trainer = common.get("trainer")
    if isinstance(trainer, dict) and isinstance(trainer.get("layout"), dict):
        return trainer["layout"].get("tensor"), trainer["layout"].get("pipeline")
    args = common.get("args")
    return (
        getattr(args, "tensor_model_parallel_size", None),
        getattr(args, "pipeline_model_parallel_size", None),
    )


def _check_full_load(
    common: dict[str, Any], content: dict[str, Any], prefix: str, path: str, precision: str
) -> None:
    """ConfigError unless the optimizer state at `path` can load into this job's layout."""
    from megatron.core import parallel_state

    from .checkpoint import precision_problems

    problems = precision_problems(common, precision, path)
    if problems:
        raise ConfigError(problems)

    if prefix:
        raise ConfigError(
            [f"{FIELD}.load: 'full' reads Megatron-LM checkpoints only; {path} is a NeMo "
             "checkpoint (keys under 'module.'): use load: weights"]
        )  # fmt: skip
    sharding = content.get("distrib_optim_sharding_type")
    if sharding is None or "opt_param_scheduler" not in common:
        raise ConfigError(
            [f"{FIELD}.load: {path} has no distributed-optimizer state to load (no "
             "distrib_optim_sharding_type in metadata.json, or no opt_param_scheduler); "
             "use load: weights"]
        )  # fmt: skip
    ours = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )
    theirs = source_layout(common)
    if sharding == "dp_reshardable" and theirs != ours:
        raise ConfigError(
            [f"{FIELD}.load: 'full' cannot change tensor/pipeline parallelism: {path} saved its "
             f"optimizer state dp_reshardable at tensor={theirs[0]}, pipeline={theirs[1]}, this "
             f"job has tensor={ours[0]}, pipeline={ours[1]}. Use load: weights, or the source's "
             "layout (or a source saved with fully_reshardable)"]
        )  # fmt: skip


def _incompatible(path: str, err: BaseException) -> ConfigError:
    return ConfigError(
        [f"{FIELD}.path: {path} cannot be loaded into this model "
         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); check that "
         "spec.model matches the checkpoint's architecture"]
    )  # fmt: skip
