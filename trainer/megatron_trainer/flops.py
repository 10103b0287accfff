"""Model FLOPs per training step, as Megatron-LM counts them, for TFLOP/s and MFU.

F = 6·B·s·[ h·E·(F_ffn·N_dense + (F_moe·topk + F_shared)·N_moe)
           + L·(h·(q + 2·kv) + q·s + q·h) + h·V_pad ]

6 = 2 FLOPs per multiply-add × 3 (forward, and backward for inputs and weights); B sequences of
length s per step; E = 3 matrices for SwiGLU, 2 otherwise; q = kv_channels·heads and
kv = kv_channels·query_groups; the causal attention term q·s is half of the full 2·q·s.
Pure Python, no torch, so it can be unit-tested and used by the benchmark.
"""

from __future__ import annotations

from megatron_contract.config import ModelConfig


def flops_per_step(model: ModelConfig, sequences: int) -> float:
    """Model FLOPs of one training step over `sequences` sequences of model.seq_length tokens."""
    h, s, n_layers = model.hidden_size, model.seq_length, model.num_layers
    matrices = 3 if model.activation == "swiglu" else 2
    if model.moe is None:
        mlp = h * matrices * model.ffn_hidden_size * n_layers
    else:
        moe = model.moe
        dense_layers = moe.first_k_dense_layers
        moe_layers = n_layers - dense_layers
        expert_width = moe.ffn_hidden_size * moe.router_top_k
        expert_width += moe.shared_expert_ffn_hidden_size or 0
        mlp = h * matrices * (model.ffn_hidden_size * dense_layers + expert_width * moe_layers)
    attention = n_layers * _attention_per_layer(model)
    logits = h * model.padded_vocab_size
    return 6.0 * sequences * s * (mlp + attention + logits)


def _attention_per_layer(model: ModelConfig) -> float:
    """Per-token multiply-adds of one attention layer (projections and the causal core)."""
    h, s, heads = model.hidden_size, model.seq_length, model.num_attention_heads
    if model.mla is None:
        q = model.kv_channels * heads
        kv = model.kv_channels * model.num_query_groups
        return h * (q + 2 * kv) + q * s + q * h
    mla = model.mla
    qk_dim = mla.qk_head_dim + mla.qk_pos_emb_head_dim
    if mla.q_lora_rank is None:
        q_proj = h * heads * qk_dim
    else:
        q_proj = h * mla.q_lora_rank + mla.q_lora_rank * heads * qk_dim
    kv_down = h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    kv_up = mla.kv_lora_rank * heads * (mla.qk_head_dim + mla.v_head_dim)
    core = heads * s * (qk_dim + mla.v_head_dim) / 2  # causal: half of QKᵀ and of AV
    out_proj = heads * mla.v_head_dim * h
    return q_proj + kv_down + kv_up + core + out_proj


def tflops_per_gpu(flops: float, step_seconds: float, world_size: int) -> float:
    return flops / (step_seconds * 1e12 * world_size)
