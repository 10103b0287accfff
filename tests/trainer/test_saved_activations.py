"""The memory estimate's activation terms against what autograd actually keeps.

core/memory.py `layer_bytes` counts, tensor by tensor, what one transformer layer keeps for its
backward pass on a GPU with Transformer Engine (fused norms, fused SwiGLU, flash attention with
native GQA, fused dropout). This machine has no GPU, so saved_activations.py builds the layers
as the trainer does on CPU (Megatron-Core's local spec with our SDPA attention), runs them
forward in fp32 and counts every saved tensor. The CPU path keeps a few more tensors than the
GPU path, each named below; with those added, the count must match.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.config import ModelConfig, parse_config
from megatron_contract.ports import free_port
from megatron_operator.core.memory import ParallelDegrees, layer_bytes

from .trainer_configs import GPT_TINY

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parents[2]
FP32 = 4
LLAMA_LIKE = {
    "numLayers": 2, "hiddenSize": 256, "ffnHiddenSize": 896, "numAttentionHeads": 8,
    "numQueryGroups": 2, "kvChannels": 32, "seqLength": 128, "maxPositionEmbeddings": 128,
}  # fmt: skip
CASES: dict[str, dict[str, Any]] = {
    "gqa-swiglu": LLAMA_LIKE,
    "gqa-gelu-dropout": {
        **LLAMA_LIKE,
        "activation": "gelu",
        "ffnHiddenSize": 1024,
        "hiddenDropout": 0.1,
    },
    "moe-shared-expert": {
        **LLAMA_LIKE,
        # The alltoall dispatcher creates a CUDA stream at construction; on one rank with EP=1
        # both dispatchers keep the same tensors (the permuted tokens).
        "moe": {
            "numExperts": 4,
            "routerTopK": 2,
            "ffnHiddenSize": 384,
            "sharedExpertFfnHiddenSize": 512,
            "firstKDenseLayers": 0,
            "auxLossCoeff": 0.0,
            "tokenDispatcher": "allgather",
            "routerPreSoftmax": False,
        },
    },
}


def _model(case: dict[str, Any]) -> ModelConfig:
    doc = json.loads(json.dumps(GPT_TINY))
    doc["model"].update(case)
    return parse_config(doc).model


ONE_RANK = ParallelDegrees(
    tp=1, pp=1, vpp=None, cp=1, ep=1, etp=1, dp=1, edp=1, sequence_parallel=False
)


def cpu_path_extra(m: ModelConfig) -> float:
    """Bytes per token the CPU path keeps beyond the GPU path, in fp32."""
    h, q = m.hidden_size, m.num_attention_heads * m.kv_channels
    kv = m.num_query_groups * m.kv_channels
    # torch's RMSNorm is unfused: each of the two norms also keeps x·rsqrt(mean(x²)) and the
    # fp32 rsqrt per token.
    extra = 2 * (FP32 * h + 4)
    # SDPAttention repeat-interleaves K and V to every query head (TE's attention takes GQA
    # natively).
    extra += 2 * FP32 * (q - kv)
    # Unfused RoPE keeps the cos and sin of the angles, fp32, for Q and for K (Transformer
    # Engine's fused RoPE keeps only the shared table of frequencies).
    extra += 4 * 4 * m.kv_channels
    # Unfused SwiGLU, silu(a) * (b + glu_linear_offset): silu(a) and b + offset are kept too.
    gated = m.activation == "swiglu"
    if gated:
        extra += (
            2 * FP32 * (m.moe.shared_expert_ffn_hidden_size or 0 if m.moe else m.ffn_hidden_size)
        )
    if m.moe is not None and gated:
        # Routed experts, weighted by the router's probabilities: also the GLU output before
        # the multiply (Megatron-Core's fused weighted SwiGLU keeps none of the three).
        extra += m.moe.router_top_k * 3 * FP32 * m.moe.ffn_hidden_size
    if m.hidden_dropout > 0:
        # The CPU dropout keeps its noise as a float tensor; CUDA's fused dropout a 1-byte mask.
        extra += 2 * (FP32 - 1) * h
    return extra


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    cases = tmp_path_factory.mktemp("saved") / "cases.json"
    cases.write_text(json.dumps(CASES))
    out = subprocess.run(
        [sys.executable, "-m", "tests.trainer.saved_activations", str(cases), str(free_port())],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_bytes_match_what_autograd_keeps(case: str, measured: dict[str, float]) -> None:
    m = _model(CASES[case])
    per_layer = layer_bytes(m, ONE_RANK, width=FP32)
    expected = (per_layer.moe if m.moe else per_layer.dense) + cpu_path_extra(m)
    assert measured[case] == pytest.approx(expected, abs=0.5), (measured[case], expected)


def test_full_recompute_keeps_only_the_layer_input() -> None:
    m = _model(LLAMA_LIKE)
    assert layer_bytes(m, ONE_RANK, width=2).kept_with_full_recompute == 2 * m.hidden_size
