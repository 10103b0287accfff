"""What Megatron-LM's own loader reads from a torch_dist checkpoint, written by us.

Megatron-LM (megatron/training/checkpointing.py at core_v0.16.1) reads, besides the model and
optimizer shards that Megatron-Core names the same for both of us:
- common state `args`: an argparse.Namespace. `load_checkpoint` takes the saved TP/PP sizes
  (`tensor_model_parallel_size`, `pipeline_model_parallel_size`) to decide whether the RNG and
  a non-reshardable optimizer can be loaded, `consumed_train_samples` (the data position),
  `no_save_optim`/`no_save_rng`; `check_checkpoint_args` compares num_layers, hidden_size,
  num_attention_heads, add_position_embedding (and, with a vocab file, max_position_embeddings,
  make_vocab_size_divisible_by, tokenizer_type); `--use-checkpoint-args`
  (`load_args_from_checkpoint`) copies the architecture fields listed in ARCHITECTURE_ARGS.
- common state `checkpoint_version`: 3.0 (older versions reorder QKV weights on load).
- common state `iteration`.
- sharded `rng_state`: `get_rng_state`'s layout, a list with one dict of the Python, NumPy,
  torch, CUDA and tracker RNG states, sharded over (PP, TP) with the DP rank as replica id, or
  over (PP, TP, DP) with expert parallelism.
Megatron-Core registers Namespace and the NumPy RNG types as torch.load safe globals, so both
sides load these with `weights_only=True`.
"""

from __future__ import annotations

import random
from argparse import Namespace
from typing import Any

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

from megatron_contract.config import TrainerConfig
from megatron_contract.paths import checkpoint_format

from .platform import Platform

CHECKPOINT_VERSION = 3.0
# Megatron-LM's --make-vocab-size-divisible-by default; our padded vocab follows the same rule
# (a multiple of 128·TP).
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128

# What `load_args_from_checkpoint` copies for --use-checkpoint-args (model part).
ARCHITECTURE_ARGS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "seq_length", "num_attention_heads",
    "num_query_groups", "group_query_attention", "kv_channels", "max_position_embeddings",
    "position_embedding_type", "add_position_embedding", "use_rotary_position_embeddings",
    "rotary_base", "rotary_percent", "rotary_interleaved", "add_bias_linear", "add_qkv_bias",
    "squared_relu", "swiglu", "untie_embeddings_and_output_weights", "apply_layernorm_1p",
    "normalization", "apply_query_key_layer_scaling", "attention_dropout", "hidden_dropout",
    "num_experts", "moe_layer_freq", "moe_ffn_hidden_size", "moe_router_topk",
    "moe_token_dispatcher_type", "moe_grouped_gemm", "moe_shared_expert_intermediate_size",
    "padded_vocab_size",
)  # fmt: skip


def megatron_lm_args(
    cfg: TrainerConfig,
    *,
    iteration: int,
    consumed_samples: int,
    sharding_type: str,
    moe_grouped_gemm: bool,
    ddp: Any = None,
) -> Namespace:
    """The `args` Megatron-LM would have saved for this job (its argument names and meanings)."""
    m, p, t = cfg.model, cfg.parallelism, cfg.training
    moe, mla = m.moe, m.mla
    args: dict[str, Any] = {
        # Architecture (what --use-checkpoint-args restores and check_checkpoint_args compares).
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "seq_length": m.seq_length,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "group_query_attention": m.num_query_groups != m.num_attention_heads,
        "kv_channels": m.kv_channels,
        "max_position_embeddings": m.max_position_embeddings,
        "position_embedding_type": m.position_embedding,
        "add_position_embedding": m.position_embedding == "learned_absolute",
        "use_rotary_position_embeddings": m.position_embedding == "rope",
        "rotary_base": int(m.rope_theta),
        "rotary_percent": 1.0,
        "rotary_interleaved": False,
        "add_bias_linear": m.add_bias_linear,
        "add_qkv_bias": False,
        "squared_relu": m.activation == "squared_relu",
        "swiglu": m.activation == "swiglu",
        "untie_embeddings_and_output_weights": m.untie_embeddings_and_output_weights,
        "apply_layernorm_1p": False,
        "normalization": m.normalization,
        "norm_epsilon": m.norm_epsilon,
        "apply_query_key_layer_scaling": False,
        "attention_dropout": m.attention_dropout,
        "hidden_dropout": m.hidden_dropout,
        "vocab_size": m.vocab_size,
        "padded_vocab_size": m.padded_vocab_size,
        "make_vocab_size_divisible_by": MAKE_VOCAB_SIZE_DIVISIBLE_BY,
        "tokenizer_type": "NullTokenizer" if cfg.data.mock else "HuggingFaceTokenizer",
        "tokenizer_model": cfg.data.tokenizer_path,
        "num_experts": moe.num_experts if moe else None,
        "moe_layer_freq": (
            [0] * moe.first_k_dense_layers + [1] * (m.num_layers - moe.first_k_dense_layers)
            if moe
            else 1
        ),
        "moe_ffn_hidden_size": moe.ffn_hidden_size if moe else None,
        "moe_router_topk": moe.router_top_k if moe else 2,
        "moe_token_dispatcher_type": moe.token_dispatcher if moe else "allgather",
        "moe_grouped_gemm": bool(moe and moe_grouped_gemm),
        "moe_shared_expert_intermediate_size": (moe.shared_expert_ffn_hidden_size if moe else None),
        "moe_aux_loss_coeff": moe.aux_loss_coeff if moe else 0.0,
        "multi_latent_attention": mla is not None,
        "q_lora_rank": mla.q_lora_rank if mla else None,
        "kv_lora_rank": mla.kv_lora_rank if mla else 32,
        "qk_head_dim": mla.qk_head_dim if mla else 128,
        "qk_pos_emb_head_dim": mla.qk_pos_emb_head_dim if mla else 64,
        "v_head_dim": mla.v_head_dim if mla else 128,
        # Parallelism (load_checkpoint compares TP/PP; the rerun state also world and DP).
        "tensor_model_parallel_size": p.tensor,
        "pipeline_model_parallel_size": p.pipeline,
        "virtual_pipeline_model_parallel_size": (
            p.virtual_pipeline if (p.virtual_pipeline or 1) > 1 else None
        ),
        "context_parallel_size": p.context,
        "expert_model_parallel_size": p.expert,
        "expert_tensor_parallel_size": p.expert_tensor,
        "sequence_parallel": p.sequence_parallel,
        "data_parallel_size": p.data,
        "world_size": cfg.world_size,
        "data_parallel_random_init": False,
        # Training state and schedule.
        "iteration": iteration,
        "consumed_train_samples": consumed_samples,
        "skipped_train_samples": 0,
        "consumed_valid_samples": 0,
        "train_iters": t.train_iters,
        "global_batch_size": t.global_batch_size,
        "micro_batch_size": t.micro_batch_size,
        "lr": t.lr,
        "min_lr": t.min_lr,
        "lr_warmup_iters": t.warmup_iters,
        "lr_decay_style": t.lr_decay_style,
        "weight_decay": t.weight_decay,
        "clip_grad": t.clip_grad,
        "adam_beta1": t.adam_beta1,
        "adam_beta2": t.adam_beta2,
        "seed": t.seed,
        "bf16": t.precision in ("bf16", "fp8"),
        "fp16": t.precision == "fp16",
        "fp8": "hybrid" if t.precision == "fp8" else None,
        "calculate_per_token_loss": True,
        # DDP: the dp_reshardable optimizer state is stored per gradient bucket, and Megatron-LM
        # derives the buckets from these (training.py `get_model`; decisions.recorded_bucket_size).
        "overlap_grad_reduce": bool(getattr(ddp, "overlap_grad_reduce", False)),
        "overlap_param_gather": bool(getattr(ddp, "overlap_param_gather", False)),
        "align_param_gather": bool(getattr(ddp, "align_param_gather", False)),
        "ddp_bucket_size": getattr(ddp, "bucket_size", None),
        "check_for_nan_in_loss_and_grad": bool(getattr(ddp, "check_for_nan_in_grad", True)),
        "loss_scale": None,
        # Megatron FSDP (--use-megatron-fsdp, optim_grads_params) saves fsdp_dtensor, which
        # Megatron-LM requires with it (arguments.py `validate_args`).
        "use_megatron_fsdp": p.fsdp,
        "use_custom_fsdp": p.fsdp,
        "data_parallel_sharding_strategy": "optim_grads_params" if p.fsdp else "no_shard",
        # Checkpoint format.
        "ckpt_format": checkpoint_format(p.fsdp),
        "use_dist_ckpt": True,
        "use_distributed_optimizer": True,
        "dist_ckpt_optim_fully_reshardable": not p.fsdp and sharding_type == "fully_reshardable",
        "no_save_optim": False,
        "no_save_rng": False,
    }
    return Namespace(**args)


# ---------------------------------------------------------------------------------------------
# RNG state in Megatron-LM's layout (checkpointing.py `get_rng_state`)


def capture_rng(platform: Platform) -> dict[str, Any]:
    return {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        # On the CPU platform there is no CUDA generator; the tracker states below are CPU
        # generator states too, so a CPU checkpoint's RNG only reloads on CPU.
        "cuda_rng_state": torch.cuda.get_rng_state() if platform.is_cuda else None,
        "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }


def restore_rng(state: dict[str, Any], platform: Platform) -> None:
    random.setstate(state["random_rng_state"])
    np.random.set_state(state["np_rng_state"])
    torch.set_rng_state(state["torch_rng_state"])
    if platform.is_cuda and state["cuda_rng_state"] is not None:
        torch.cuda.set_rng_state(state["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["rng_tracker_states"])


def rng_sharded_object(state: list[dict[str, Any]] | None) -> ShardedObject:
    """The `rng_state` entry: one list per (PP, TP) rank, DP ranks are replicas (each keeps its
    own state in memory, all start from the same seed and draw alike); with expert parallelism
    sharded over DP too, as in Megatron-LM."""
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    if parallel_state.get_expert_model_parallel_world_size() > 1:
        dp = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
        return ShardedObject(
            "rng_state", state, (pp, tp, dp), (pp_rank, tp_rank, dp_rank), replica_id=0
        )
    return ShardedObject("rng_state", state, (pp, tp), (pp_rank, tp_rank), replica_id=dp_rank)
