"""What Megatron-LM's `load_checkpoint` reads from a torch_dist checkpoint, run offline.

Megatron-LM is not a pip package, so its loader cannot run here. This module performs the same
reads and checks, in the same order, as megatron/training/checkpointing.py at core_v0.16.1,
calling the Megatron-Core functions it calls (`dist_checkpointing.check_is_distributed_checkpoint`,
`load_common_state_dict`, `load_content_metadata`) and reading the sharded `rng_state` objects
from the files. Each step names the Megatron-LM function it mirrors. Written for our tests; not
Megatron-LM's code.
"""

from __future__ import annotations

import io
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from megatron.core import dist_checkpointing
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from torch.distributed.checkpoint import FileSystemReader

RNG_KEYS = (
    "random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states",
)  # fmt: skip


@dataclass
class LoadPlan:
    """What Megatron-LM would load, and the values it takes from the checkpoint."""

    iteration: int
    checkpoint_version: float
    consumed_train_samples: int
    loads_rng: bool
    loads_optimizer: bool
    sharding_type: str
    rng: dict[tuple[int, ...], list[dict[str, Any]]] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)


class MegatronLMRefuses(AssertionError):
    """Megatron-LM's loader would stop here (an assert, RuntimeError or sys.exit there)."""


def run_args(**overrides: Any) -> Namespace:
    """The Megatron-LM command-line args of a run that loads our gpt-tiny checkpoint."""
    args = {
        "num_layers": 4, "hidden_size": 128, "num_attention_heads": 4,
        "add_position_embedding": False,  # --position-embedding-type rope --no-position-embedding
        "max_position_embeddings": 128, "make_vocab_size_divisible_by": 128,
        "tokenizer_type": "NullTokenizer", "vocab_file": None,
        "data_parallel_random_init": False, "phase_transition_iterations": None,
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
        "use_dist_ckpt": True, "ckpt_format": "torch_dist", "auto_detect_ckpt_format": False,
        "use_distributed_optimizer": True, "ckpt_fully_parallel_load": False,
        "finetune": False, "no_load_rng": False, "no_load_optim": False, "ckpt_step": None,
    }  # fmt: skip
    args.update(overrides)
    return Namespace(**args)


def read_tracker(load_dir: Path) -> int:
    """checkpointing.py `read_metadata`: an integer, or 'release'."""
    text = (load_dir / "latest_checkpointed_iteration.txt").read_text().strip()
    if not text.isdigit():
        raise MegatronLMRefuses(f"invalid metadata file ({text!r})")
    return int(text)


def sharded_objects(checkpoint: Path, key: str) -> dict[tuple[int, ...], Any]:
    """The ShardedObject `key` of every rank, by global offset, read from the .distcp files (the
    torch_dist strategy stores each as a torch.save'd blob); weights_only, as on load."""
    metadata = FileSystemReader(str(checkpoint)).read_metadata()
    found = {}
    for index, info in metadata.storage_data.items():
        name = index.fqn
        if not name.startswith(f"{key}/shard_"):
            continue
        offset = tuple(int(x) for x in name.split("shard_")[1].split("_")[0].split("."))
        with open(checkpoint / info.relative_path, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        # Megatron-Core's torch_dist strategy saves `[sh_obj.data for sh_obj in sh_objs]`
        # (strategies/torch.py `_mcore_to_torch_sharded_object`): one object per entry here.
        (data,) = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        found[offset] = data
    return found


def plan_load(load_dir: Path, args: Namespace) -> LoadPlan:
    """checkpointing.py `load_checkpoint` + `_load_base_checkpoint` + `check_checkpoint_args`."""
    # _load_base_checkpoint: tracker, then iter_%07d (get_checkpoint_name, return_base_dir).
    iteration = args.ckpt_step or read_tracker(load_dir)
    checkpoint = load_dir / f"iter_{iteration:07d}"
    # _get_checkpoint_format
    if not dist_checkpointing.check_is_distributed_checkpoint(str(checkpoint)):
        raise MegatronLMRefuses(f"unknown checkpoint format in {checkpoint}")
    if not (args.use_dist_ckpt or args.auto_detect_ckpt_format):
        # _load_global_dist_base_checkpoint with a sharded state dict of None
        raise MegatronLMRefuses(
            "Detected load from a distributed checkpoint, but neither --use-dist-ckpt nor "
            "--auto-detect-ckpt-format is set."
        )
    # _load_global_dist_base_checkpoint(rank0=True)
    state_dict = dist_checkpointing.load_common_state_dict(str(checkpoint))
    messages = []
    # load_checkpoint, torch_dist branch
    ckpt_args = state_dict.get("args", Namespace())
    ckpt_tp_pp = (
        getattr(ckpt_args, "tensor_model_parallel_size", 1),
        getattr(ckpt_args, "pipeline_model_parallel_size", 1),
    )
    run_tp_pp = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size)
    loads_rng = (
        ckpt_tp_pp == run_tp_pp
        and not args.finetune
        and not args.no_load_rng
        and not getattr(ckpt_args, "no_save_rng", False)
    )
    if ckpt_tp_pp != run_tp_pp:
        messages.append("RNG state will be ignored")
    content = dist_checkpointing.load_content_metadata(preloaded_state_dict=state_dict)
    loads_optimizer = (
        not args.finetune
        and not args.no_load_optim
        and not getattr(ckpt_args, "no_save_optim", False)
    )
    sharding = (content or {}).get("distrib_optim_sharding_type", "dp_zero_gather_scatter")
    if (
        loads_optimizer
        and args.use_distributed_optimizer
        and (
            ckpt_tp_pp != run_tp_pp
            and sharding not in DistributedOptimizer.checkpoint_fully_reshardable_formats
        )
    ):
        raise MegatronLMRefuses(
            f"(TP, PP) mismatch after resume ({run_tp_pp} vs {ckpt_tp_pp} from checkpoint):"
            f" not supported for DistributedOptimizer with sharding type {sharding}"
        )
    # The sharded state dict Megatron-LM generates holds `rng_state` only when loading it, with
    # get_rng_state's ShardedObject: global shape (PP, TP), or (PP, TP, DP) with EP > 1.
    rng = sharded_objects(checkpoint, "rng_state") if loads_rng else {}
    if loads_rng:
        expected = ckpt_tp_pp[1] * ckpt_tp_pp[0]
        if len(rng) != expected:
            raise MegatronLMRefuses(f"rng_state has {len(rng)} shards, expected {expected}")
    if loads_optimizer and "opt_param_scheduler" not in state_dict:
        raise MegatronLMRefuses("Unable to load optimizer from checkpoint (KeyError)")
    # Iteration (0 with --finetune), checkpoint version, then check_checkpoint_args.
    if args.finetune:
        loaded_iteration = 0
    elif "iteration" in state_dict:
        loaded_iteration = int(state_dict["iteration"])
    else:
        raise MegatronLMRefuses("unable to load iteration from checkpoint")
    version = float(state_dict.get("checkpoint_version", 0))
    consumed = 0
    if "args" in state_dict and not args.finetune:
        _check_checkpoint_args(state_dict["args"], args, version)
        consumed = int(getattr(state_dict["args"], "consumed_train_samples", 0))
    # rng states: rng_state[0] (no data_parallel_random_init), with every key read.
    for states in rng.values():
        for key in RNG_KEYS:
            if key not in states[0]:
                raise MegatronLMRefuses(f"Unable to load rng state from checkpoint ({key})")
        if not states[0]["rng_tracker_states"]:
            raise MegatronLMRefuses("Unable to load rng state from checkpoint (empty tracker)")
    return LoadPlan(
        iteration=loaded_iteration,
        checkpoint_version=version,
        consumed_train_samples=consumed,
        loads_rng=loads_rng,
        loads_optimizer=loads_optimizer,
        sharding_type=sharding,
        rng=rng,
        messages=messages,
    )


def _check_checkpoint_args(ckpt: Namespace, args: Namespace, version: float) -> None:
    """checkpointing.py `check_checkpoint_args` (an assert per field there)."""

    def compare(name: str, default: Any = None) -> None:
        theirs = getattr(ckpt, name, default) if default is not None else getattr(ckpt, name)
        if theirs != getattr(args, name):
            raise MegatronLMRefuses(
                f"{name} value from checkpoint ({theirs}) is not equal to the input argument "
                f"value ({getattr(args, name)})."
            )

    compare("num_layers")
    compare("hidden_size")
    compare("num_attention_heads")
    compare("add_position_embedding", default=True)
    if args.vocab_file:
        compare("max_position_embeddings")
        compare("make_vocab_size_divisible_by")
        compare("tokenizer_type")
    if args.data_parallel_random_init:
        compare("data_parallel_random_init")
    if version < 3.0:
        raise MegatronLMRefuses("checkpoint version < 3.0 compares model_parallel_size")
    if not args.use_dist_ckpt:
        compare("tensor_model_parallel_size")
        compare("pipeline_model_parallel_size")
