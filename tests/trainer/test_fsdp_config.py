"""parallelism.fsdp at the config level (CPU): what the trainer asks Megatron-Core for, and why
the CPU platform refuses it. The CUDA run is tests/trainer/test_gpu.py."""

from __future__ import annotations

import pytest
from megatron.core.distributed import DistributedDataParallelConfig

from megatron_contract.config import parse_config
from megatron_contract.errors import ConfigError
from megatron_trainer.decisions import ddp_options
from megatron_trainer.model import fsdp_options
from megatron_trainer.validate import validate

from .trainer_configs import tiny_config

pytestmark = pytest.mark.trainer


def test_fsdp_asks_megatron_core_for_fully_sharded_data_parallel() -> None:
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=True,
        bucket_size=40_000_000,
        **{**ddp_options(True, "bf16", interleaved=False), **fsdp_options(True)},
    )
    assert ddp.use_megatron_fsdp
    assert ddp.data_parallel_sharding_strategy == "optim_grads_params"
    assert fsdp_options(False) == {}


def test_fsdp_on_cpu_is_refused_before_any_rank_starts(tmp_path: object) -> None:
    cfg = tiny_config("/tmp/unused", tp=1, dp=2)
    cfg["parallelism"]["fsdp"] = True
    with pytest.raises(ConfigError) as err:
        validate(parse_config(cfg), check_paths=False)
    assert "parallelism.fsdp" in str(err.value) and "CUDA" in str(err.value)


def test_megatron_fsdp_in_0_16_1_needs_cuda_streams() -> None:
    """Why the rule exists: MegatronFSDP, as it is built, creates torch.cuda.Stream objects for
    its buffer copies and parameter gathers (megatron_fsdp.py), and its adapter defaults the
    device to cuda:<current device>; gloo on a CPU-only torch has neither."""
    import inspect

    from megatron.core.distributed.fsdp import mcore_fsdp_adapter
    from megatron.core.distributed.fsdp.src.megatron_fsdp import megatron_fsdp

    source = inspect.getsource(megatron_fsdp.MegatronFSDP)
    assert "torch.cuda.Stream()" in source
    assert 'torch.device(f"cuda:{torch.cuda.current_device()}")' in source
    assert "torch.device(f'cuda:" in inspect.getsource(mcore_fsdp_adapter)


def test_fsdp_checkpoint_args_are_megatron_lms() -> None:
    """The `args` of an FSDP checkpoint say what Megatron-LM requires with --use-megatron-fsdp:
    the fsdp_dtensor format (shardingType does not apply to it)."""
    from megatron_trainer.interchange import megatron_lm_args

    cfg = tiny_config("/tmp/unused", dp=2)
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    cfg["training"]["precision"] = "bf16"
    for fsdp, fmt in [(True, "fsdp_dtensor"), (False, "torch_dist")]:
        cfg["parallelism"]["fsdp"] = fsdp
        args = megatron_lm_args(
            parse_config(cfg),
            iteration=3,
            consumed_samples=24,
            sharding_type="fully_reshardable",
            moe_grouped_gemm=False,
        )
        assert (args.ckpt_format, args.use_megatron_fsdp) == (fmt, fsdp)
        assert args.dist_ckpt_optim_fully_reshardable is (not fsdp)
        assert args.data_parallel_sharding_strategy == (
            "optim_grads_params" if fsdp else "no_shard"
        )


def test_what_fsdp_checkpoints_cannot_do_is_refused_before_any_rank_starts() -> None:
    cfg = tiny_config("msc://s3/jobs/a", dp=2)
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    cfg["training"]["precision"] = "bf16"
    cfg["parallelism"]["fsdp"] = True
    cfg["checkpoint"]["init"] = {"huggingFace": None, "megatron": {"path": "/i", "load": "full"}}
    with pytest.raises(ConfigError) as err:
        validate(parse_config(cfg), check_paths=False)
    assert [p.split(":")[0] for p in err.value.problems] == [
        "checkpoint.init.megatron.load",
        "checkpoint.dir",
    ]
