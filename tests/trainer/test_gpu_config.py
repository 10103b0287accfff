"""What the trainer asks Megatron-Core for on CUDA, derived on this CPU machine (issue 12).

The CUDA paths cannot run here, so the decisions are pure functions (megatron_trainer.decisions)
and the tests assert them, and the TransformerConfig / DDP config objects built from them, for
every layout class. Where Megatron-Core validates a combination itself (TransformerConfig's
__post_init__), the real config object is constructed.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_contract.config import TrainerConfig, load_config
from megatron_contract.env import runtime_env
from megatron_contract.errors import ConfigError
from megatron_trainer import model as model_module
from megatron_trainer.checkpoint import persistent_async_worker
from megatron_trainer.decisions import (
    CUDA_DEVICE_MAX_CONNECTIONS,
    SHARDING_DP,
    SHARDING_FULL,
    attention_choice,
    cuda_env_defaults,
    ddp_options,
    derive_p2p_flags,
    fused_ops,
    gradient_accumulation_fusion,
    rank_seed,
    save_sharding_type,
)
from megatron_trainer.launcher import rank_env
from megatron_trainer.platform import Platform
from megatron_trainer.platform.cuda import PEAK_BF16_TFLOPS, peak_for_device

from .trainer_configs import tiny_config, write_config

pytestmark = pytest.mark.trainer

CUDA = Platform("cuda", "nccl", torch.device("cuda", 0))
CPU = Platform("cpu", "gloo", torch.device("cpu"))

MOE = {
    "numExperts": 4, "routerTopK": 2, "ffnHiddenSize": 176, "sharedExpertFfnHiddenSize": None,
    "firstKDenseLayers": 1, "auxLossCoeff": 0.01, "tokenDispatcher": "alltoall", "routerPreSoftmax": False,
}  # fmt: skip
MLA = {"qLoraRank": None, "kvLoraRank": 64, "qkHeadDim": 32, "qkPosEmbHeadDim": 16, "vHeadDim": 24}

# Layout classes: (parallelism overrides, model overrides).
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "dense": ({}, {}),
    "tp2": ({"tensor": 2, "expertTensor": 2}, {}),
    "pp2": ({"pipeline": 2}, {}),
    "pp2-vpp2": ({"pipeline": 2, "virtualPipeline": 2}, {}),
    "pp4-vpp2": ({"pipeline": 4, "virtualPipeline": 2, "data": 1}, {"numLayers": 8}),
    "cp2": ({"context": 2}, {}),
    "moe-ep2": ({"expert": 2}, {"moe": MOE}),
    "mla": ({}, {"mla": MLA}),
}


def build_config(tmp_path: Path, layout: str, **model: Any) -> TrainerConfig:
    parallel, model_overrides = LAYOUTS[layout]
    cfg = tiny_config(tmp_path / "ckpt")
    cfg["parallelism"].update(parallel)
    cfg["model"].update(copy.deepcopy(model_overrides), **model)
    cfg["training"]["precision"] = "bf16"
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    return load_config(write_config(cfg, tmp_path / f"{layout}.json"))


# -- item 1: pipeline send/recv -------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuda_never_batches_two_sends_to_the_same_peer(tmp_path: Path, layout: str) -> None:
    cfg = build_config(tmp_path, layout)
    config = model_module.transformer_config(cfg, CUDA)
    interleaved = layout.startswith(("pp2-vpp2", "pp4-vpp2"))
    # Megatron-LM: overlap when interleaving, batch = not overlap.
    assert config.overlap_p2p_comm is interleaved
    assert config.batch_p2p_comm is (not interleaved)
    assert not (config.overlap_p2p_comm and config.batch_p2p_comm)


def test_p2p_flags_for_every_pipeline_shape() -> None:
    for pipeline, vpp in [(1, None), (2, None), (4, None), (2, 1)]:
        assert derive_p2p_flags(pipeline, vpp, True).batch_p2p_comm
        assert not derive_p2p_flags(pipeline, vpp, True).overlap_p2p_comm
    for pipeline, vpp in [(2, 2), (2, 4), (4, 2), (8, 3)]:
        flags = derive_p2p_flags(pipeline, vpp, True)
        assert flags.overlap_p2p_comm and not flags.batch_p2p_comm
    # gloo: the plain unbatched, non-overlapped path (bit-identical to PP=1, test_layouts.py).
    for pipeline, vpp in [(1, None), (2, None), (2, 2)]:
        flags = derive_p2p_flags(pipeline, vpp, False)
        assert not flags.overlap_p2p_comm and not flags.batch_p2p_comm


# -- item 6: fusions, and Megatron-Core's own config errors exit 78 ---------------------------


@pytest.mark.parametrize(
    ("activation", "bias", "fused"),
    [("gelu", False, False), ("gelu", True, True), ("swiglu", False, True),
     ("squared_relu", False, False), ("squared_relu", True, False)],
)  # fmt: skip
def test_cuda_fuses_only_what_megatron_core_accepts(
    tmp_path: Path, activation: str, bias: bool, fused: bool
) -> None:
    cfg = build_config(tmp_path, "dense", activation=activation, addBiasLinear=bias)
    # The real TransformerConfig: its __post_init__ raised ValueError for gelu without bias.
    config = model_module.transformer_config(cfg, CUDA)
    assert config.bias_activation_fusion is fused
    assert config.bias_dropout_fusion and config.cross_entropy_loss_fusion


def test_cpu_fuses_nothing() -> None:
    assert not any(fused_ops("swiglu", True, is_cuda=False, te=False, mla=False).values())
    assert fused_ops("swiglu", False, is_cuda=True, te=True, mla=False)["apply_rope_fusion"]
    assert not fused_ops("swiglu", False, is_cuda=True, te=True, mla=True)["apply_rope_fusion"]
    assert not fused_ops("swiglu", False, is_cuda=True, te=False, mla=False)["apply_rope_fusion"]


def test_a_model_megatron_core_rejects_is_a_config_error(tmp_path: Path) -> None:
    # Whatever TransformerConfig.__post_init__ rejects (validate() catches this one earlier;
    # here it stands for the checks validate() does not repeat) exits 78, not 1.
    cfg = build_config(tmp_path, "tp2")
    cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, tensor=3))
    with pytest.raises(ConfigError, match=r"model: Megatron-Core 0\.16\.1 rejects .*multiple"):
        model_module.transformer_config(cfg, CUDA)


# -- item 7: gradient accumulation fusion needs Apex ------------------------------------------


def test_gradient_accumulation_fusion_needs_te_and_apex() -> None:
    assert gradient_accumulation_fusion(te=True, apex=True)
    assert not gradient_accumulation_fusion(te=True, apex=False)
    assert not gradient_accumulation_fusion(te=False, apex=True)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_te_without_apex_turns_gradient_accumulation_fusion_off(
    tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = build_config(tmp_path, layout)
    monkeypatch.setattr(model_module, "use_transformer_engine", lambda platform: True)
    monkeypatch.setattr(model_module, "apex_available", lambda platform: False)
    # kwargs, not the object: TE's fused RoPE is checked at construction and TE is absent here.
    kwargs = model_module.transformer_config_kwargs(cfg, CUDA)
    assert kwargs["gradient_accumulation_fusion"] is False
    monkeypatch.setattr(model_module, "apex_available", lambda platform: True)
    assert model_module.transformer_config_kwargs(cfg, CUDA)["gradient_accumulation_fusion"]


# -- item 8: pipeline stages get their own seeds ----------------------------------------------


def test_stage_seeds_follow_megatron_lm() -> None:
    assert [rank_seed(1234, pp) for pp in range(4)] == [1234, 1334, 1434, 1534]


# -- item 10: Hopper defaults -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "cp", "expected"), [(1, 1, None), (2, 1, "1"), (1, 2, "1"), (8, 2, "1")]
)
def test_cuda_device_max_connections(tp: int, cp: int, expected: str | None) -> None:
    env = cuda_env_defaults(tp, cp, cores=64, procs_per_node=8)
    assert env.get(CUDA_DEVICE_MAX_CONNECTIONS) == expected
    assert env["OMP_NUM_THREADS"] == "8"


def test_launcher_gives_cuda_ranks_the_defaults_and_keeps_the_pods_own(tmp_path: Path) -> None:
    environ = {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "NNODES": "1",
        "NODE_RANK": "0", "NPROC_PER_NODE": "8", "MEGATRON_CONFIG": str(tmp_path / "c.json"),
        "MEGATRON_JOB_NAME": "j", "MEGATRON_RESTART_ATTEMPT": "0",
    }  # fmt: skip
    env = runtime_env(environ)
    child = rank_env(environ, env, 3, cpu=False, parallel=(8, 1))
    assert child[CUDA_DEVICE_MAX_CONNECTIONS] == "1"
    assert int(child["OMP_NUM_THREADS"]) >= 1
    assert CUDA_DEVICE_MAX_CONNECTIONS not in rank_env(environ, env, 3, cpu=True, parallel=(8, 1))
    own = rank_env({**environ, "OMP_NUM_THREADS": "3"}, env, 3, cpu=False, parallel=(8, 1))
    assert own["OMP_NUM_THREADS"] == "3"


def test_ddp_overlaps_param_gather_and_checks_for_nan_on_cuda() -> None:
    cuda = ddp_options(is_cuda=True)
    assert cuda == {
        "check_for_nan_in_grad": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
    }  # fmt: skip
    from megatron.core.distributed import DistributedDataParallelConfig

    config = DistributedDataParallelConfig(use_distributed_optimizer=True, **cuda)
    assert config.overlap_param_gather and config.check_for_nan_in_grad
    assert ddp_options(is_cuda=False)["check_for_nan_in_grad"]


def test_attention_choice_is_explained() -> None:
    spec, why = attention_choice(te=False, is_cuda=True, mla=False, moe=False)
    assert "scaled_dot_product_attention" in spec and "flash" in spec
    assert "transformer_engine does not import" in why
    spec, why = attention_choice(te=True, is_cuda=True, mla=True, moe=True)
    assert "Transformer Engine" in spec and "MLA" in spec and "MoE" in spec


# -- item 11: sharding type per save ----------------------------------------------------------


def test_fully_reshardable_only_for_the_final_save() -> None:
    assert save_sharding_type(SHARDING_DP, final=False) == SHARDING_DP
    assert save_sharding_type(SHARDING_DP, final=True) == SHARDING_DP
    assert save_sharding_type(SHARDING_FULL, final=False) == SHARDING_DP
    assert save_sharding_type(SHARDING_FULL, final=True) == SHARDING_FULL


# -- item 3: async save caller ----------------------------------------------------------------


def test_async_save_uses_the_persistent_worker_on_cuda() -> None:
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    # `persistent` makes the queue hand every request to one PersistentAsyncCaller (a spawned
    # worker) instead of a TemporalAsyncCaller (a fork per save); the caller itself needs an
    # initialised process group, so it is exercised by the gpu-marked test.
    assert AsyncCallsQueue(persistent=persistent_async_worker(is_cuda=True)).persistent
    assert not persistent_async_worker(is_cuda=False)


# -- GPU readiness: the MFU peak table --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("Tesla T4", None),
    ],
)
def test_peak_table_tells_pcie_and_nvl_parts_apart(name: str, peak: float | None) -> None:
    assert peak_for_device(name) == peak
    assert all(v > 0 for v in PEAK_BF16_TFLOPS.values())
