"""Megatron-LM's FLOPs formula (for TFLOP/s and MFU), checked against hand-computed values."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_contract.config import MLAConfig, MoEConfig, parse_config
from megatron_trainer.flops import flops_per_step, tflops_per_gpu

from .trainer_configs import GPT_TINY

pytestmark = pytest.mark.trainer

TINY = parse_config(GPT_TINY).model


def test_gpt_tiny_by_hand() -> None:
    # Per token and layer: SwiGLU 3·h·ffn, QKV h·(q + 2kv), causal core q·s, output q·h.
    h, ffn, s, q, kv, vocab, layers = 128, 352, 128, 32 * 4, 32 * 2, 1024, 4
    per_token = layers * (3 * h * ffn + h * (q + 2 * kv) + q * s + q * h) + h * vocab
    assert per_token == 933_888
    assert flops_per_step(TINY, 8) == 6 * 8 * s * per_token


def test_moe_counts_active_experts_only() -> None:
    moe = MoEConfig(
        num_experts=8,
        router_top_k=2,
        ffn_hidden_size=352,
        shared_expert_ffn_hidden_size=None,
        first_k_dense_layers=1,
        aux_loss_coeff=0.01,
        token_dispatcher="alltoall",
        router_pre_softmax=False,
    )
    model = dataclasses.replace(TINY, moe=moe)
    dense = flops_per_step(TINY, 1)
    # Three MoE layers each run two experts of the dense MLP's size: three extra MLPs.
    extra_mlp = 6 * 128 * 3 * 128 * 352 * 3
    assert flops_per_step(model, 1) == dense + extra_mlp
    shared = dataclasses.replace(
        model, moe=dataclasses.replace(moe, shared_expert_ffn_hidden_size=352)
    )
    assert flops_per_step(shared, 1) == dense + 2 * extra_mlp


def test_mla_attention_is_counted() -> None:
    mla = MLAConfig(
        q_lora_rank=None, kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=16, v_head_dim=32
    )
    with_mla = flops_per_step(dataclasses.replace(TINY, mla=mla), 1)
    assert with_mla > flops_per_step(dataclasses.replace(TINY, num_layers=0), 1)


def test_tflops_per_gpu() -> None:
    assert tflops_per_gpu(8e12, 2.0, 4) == pytest.approx(1.0)
