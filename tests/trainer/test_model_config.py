"""The resolved model maps onto Megatron-Core's own config classes, whose __post_init__ checks
them: dense bf16, Mixtral-style MoE with expert parallelism, and DeepSeek-style MLA, as a CUDA pod
without Transformer Engine builds them (no GPU is needed to build a config; TE is not installed
here, and Megatron-Core checks for it, so the TE variants are not covered)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from megatron_contract.config import parse_config
from megatron_contract.errors import ConfigError
from megatron_trainer import model
from megatron_trainer.platform import Platform

from .trainer_configs import GPT_TINY

pytestmark = pytest.mark.trainer

CUDA = Platform("cuda", "nccl", torch.device("cuda", 0))
CPU = Platform("cpu", "gloo", torch.device("cpu"))


def gpu_config(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(GPT_TINY)
    data["resources"].update(accelerator="nvidia.com/gpu", procsPerNode=4)
    data["parallelism"].update(data=4, expertData=4)
    data["training"].update(precision="bf16", numMicrobatches=1)
    for section, fields in changes.items():
        data[section].update(fields)
    return data


def test_dense_bf16_on_gpu() -> None:
    config = model.transformer_config(parse_config(gpu_config()), CUDA)
    assert config.bf16 and config.params_dtype == torch.bfloat16
    assert config.gated_linear_unit and config.num_query_groups == 2
    assert config.calculate_per_token_loss and not config.use_cpu_initialization
    assert config.batch_p2p_comm and config.bias_activation_fusion
    assert not config.apply_rope_fusion  # TE's kernel; absent here


def test_moe_with_expert_parallelism() -> None:
    moe = {
        "numExperts": 8, "routerTopK": 2, "ffnHiddenSize": 64, "sharedExpertFfnHiddenSize": 64,
        "firstKDenseLayers": 1, "auxLossCoeff": 0.01, "tokenDispatcher": "alltoall", "routerPreSoftmax": False,
    }  # fmt: skip
    data = gpu_config(
        model={"moe": moe},
        parallelism={"expert": 2, "expertData": 2},
    )
    config = model.transformer_config(parse_config(data), CUDA)
    assert config.num_moe_experts == 8 and config.moe_router_topk == 2
    assert config.moe_layer_freq == [0, 1, 1, 1]
    assert config.moe_shared_expert_intermediate_size == 64
    assert config.expert_model_parallel_size == 2
    assert not config.moe_grouped_gemm  # grouped GEMM needs TE: experts run one by one
    assert not config.moe_router_pre_softmax  # Mixtral's: top-k, then softmax over the k


def test_deepseek_routing_is_softmax_then_top_k() -> None:
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    moe = {
        "numExperts": 8, "routerTopK": 2, "ffnHiddenSize": 64, "sharedExpertFfnHiddenSize": 64,
        "firstKDenseLayers": 0, "auxLossCoeff": 0.0, "tokenDispatcher": "alltoall",
        "routerPreSoftmax": True,
    }  # fmt: skip
    config = model.transformer_config(parse_config(gpu_config(model={"moe": moe})), CUDA)
    assert config.moe_router_pre_softmax and config.moe_router_score_function == "softmax"
    # What that flag does in Megatron-Core: the chosen experts keep their share of a softmax
    # over all of them (DeepSeek-V2, not renormalised), where top-k-then-softmax sums to 1.
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0, 0.1, 0.2, 0.3]])
    probs, _ = topk_routing_with_score_function(logits, 2, use_pre_softmax=True)
    want = torch.softmax(logits, dim=-1).topk(2).values
    assert torch.allclose(probs[probs > 0], want.flatten())
    assert probs.sum().item() < 0.99


def test_multi_latent_attention() -> None:
    mla = {
        "qLoraRank": None,
        "kvLoraRank": 32,
        "qkHeadDim": 32,
        "qkPosEmbHeadDim": 16,
        "vHeadDim": 32,
    }
    config = model.transformer_config(parse_config(gpu_config(model={"mla": mla})), CUDA)
    assert type(config).__name__ == "MLATransformerConfig"
    assert config.q_lora_rank is None and config.kv_lora_rank == 32


def test_cpu_config_is_layout_independent_fp32() -> None:
    config = model.transformer_config(parse_config(GPT_TINY), CPU)
    assert config.params_dtype == torch.float32 and not config.bf16
    assert config.use_cpu_initialization and not config.batch_p2p_comm
    assert not (config.bias_activation_fusion or config.masked_softmax_fusion)


def test_features_that_need_transformer_engine() -> None:
    # This machine has no TE: fp8 and sequence parallelism are configuration errors, not crashes.
    fp8 = parse_config(gpu_config(training={"precision": "fp8"}))
    with pytest.raises(ConfigError, match="fp8 needs Transformer Engine"):
        model.transformer_config(fp8, CUDA)
    sp = parse_config(
        gpu_config(parallelism={"tensor": 2, "data": 2, "expertTensor": 2, "expertData": 2,
                                "sequenceParallel": True})
    )  # fmt: skip
    with pytest.raises(ConfigError, match="sequenceParallel needs Transformer Engine") as err:
        model.transformer_config(sp, CUDA)
    assert "sequenceParallel: false" in str(err.value)


def test_layer_seeds_differ_per_layer_and_seed() -> None:
    seeds = {model.layer_seed(s, layer) for s in (1, 2) for layer in range(5)}
    assert len(seeds) == 10
