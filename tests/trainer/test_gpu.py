"""Checks that need CUDA (issue 12, "GPU readiness"), marked `gpu`; skipped without a GPU.

Run on a machine with one GPU: `pytest -m gpu tests/trainer/test_gpu.py`. First run on an H200
on 2026-11-28 (docs/benchmarks.md, GPU): it found the trainer hanging in NCCL's teardown at exit,
and a defect in the flash test, both fixed since but not rerun on a GPU. fp16 with the dynamic
loss scaler and an error exit with the persistent writer alive were not reached; on CPU,
test_gpu_config and test_non_finite cover them. Each run is a real `python -m megatron_trainer` on
NCCL with one rank, as a one-GPU pod would run it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_contract.env import INJECT_FAILURE, INJECT_NAN_LOSS
from megatron_contract.exitcodes import ExitCode
from megatron_trainer.checkpoint import TRACKER, iteration_dir, read_tracker

from .trainer_configs import tiny_config
from .trainer_runs import processes_with_env, run_trainer

pytestmark = [
    pytest.mark.trainer,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gpu_config(ckpt: Path, **training: Any) -> dict[str, Any]:
    cfg = tiny_config(ckpt, **training)
    cfg["training"]["precision"] = "bf16"
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    return cfg


def test_bf16_training_on_one_gpu_lowers_the_loss(workdir: Path) -> None:
    run = run_trainer(gpu_config(workdir / "ckpt", trainIters=40, save_interval=100), workdir)
    assert run.returncode == 0, run.output[-4000:]
    losses = run.losses()
    assert sorted(losses) == list(range(1, 41))
    assert all(math.isfinite(v) for v in losses.values())
    assert losses[40] < losses[1] - 0.5, losses
    assert all(r["mfu"] is None or 0 < r["mfu"] < 1 for r in run.progress)


def test_sdpa_takes_the_flash_kernel() -> None:
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from megatron_trainer.attention import SDPAttention

    config = TransformerConfig(
        num_layers=1, hidden_size=256, num_attention_heads=4, num_query_groups=2,
        kv_channels=64, bf16=True, params_dtype=torch.bfloat16,
        attention_dropout=0.0,  # dropout would make flash and math differ (and needs the RNG tracker)
    )  # fmt: skip
    attention = SDPAttention(config, 1, AttnMaskType.causal, "self").cuda()
    q = torch.randn(128, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(128, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(128, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if flash cannot run these inputs
        flash = attention(q, k, v, None)
    with sdpa_kernel([SDPBackend.MATH]):
        reference = attention(q, k, v, None)
    assert flash.shape == (128, 2, 256)
    assert torch.allclose(flash.float(), reference.float(), atol=2e-2)


def test_async_save_with_the_persistent_worker_loads_back_identically(workdir: Path) -> None:
    ckpt = workdir / "ckpt"
    cfg = gpu_config(ckpt, trainIters=6, save_interval=2)
    cfg["checkpoint"].update(keep=0, **{"async": True})
    full = run_trainer(cfg, workdir, name="full")
    assert full.returncode == 0, full.output[-4000:]
    assert "checkpoint 4: async save started" in full.output
    # Resume from the async-saved iteration 4, as a restart after losing iteration 6 would.
    shutil.rmtree(iteration_dir(ckpt, 6))
    (ckpt / TRACKER).write_text("4\n")
    resumed = run_trainer(cfg, workdir, name="resumed")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "RESUME: loading checkpoint iteration 4" in resumed.output
    before, after = full.losses(), resumed.losses()
    # Iteration 5's loss is a forward pass of the loaded weights on the same data.
    assert after[5] == before[5]
    assert after[6] == pytest.approx(before[6], rel=1e-3)


def test_a_memory_snapshot_restores_on_the_gpu(workdir: Path) -> None:
    """The in-memory tier on CUDA: Megatron-LM's fully_parallel algorithm, the snapshot staged
    to host memory, restored onto the GPU (the CPU tests run the atomic algorithm)."""
    cfg = gpu_config(workdir / "ckpt", trainIters=6, save_interval=100)
    cfg["checkpoint"].update(keep=0, memory={"dir": str(workdir / "memory"), "interval": 1,
                                              "replica": False})  # fmt: skip
    full = run_trainer(cfg, workdir, name="full")
    assert full.returncode == 0, full.output[-4000:]
    # A restart whose durable checkpoint is gone resumes from the snapshot of step 5 (the last
    # step has none: its save is the durable one).
    shutil.rmtree(workdir / "ckpt")
    resumed = run_trainer(cfg, workdir, name="resumed")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "RESUME: loading the snapshot of iteration 5" in resumed.output
    assert resumed.progress[0]["restored"] == {"tier": "Memory", "step": 5}
    assert resumed.losses()[6] == full.losses()[6]


def test_nan_loss_exits_non_finite_before_saving(workdir: Path) -> None:
    ckpt = workdir / "ckpt"
    run = run_trainer(
        gpu_config(ckpt, trainIters=6, save_interval=1),
        workdir,
        extra_env={INJECT_NAN_LOSS: "3"},
    )
    assert run.returncode == ExitCode.NON_FINITE, run.output[-4000:]
    assert read_tracker(ckpt) == 2
    assert not iteration_dir(ckpt, 3).exists()


def test_fp16_overflows_go_to_the_dynamic_loss_scaler(workdir: Path) -> None:
    """fp16 starts at loss scale 2^32, so the first steps' gradients overflow by design: the
    scaler skips them and lowers the scale (no exit 17), and the loss then falls."""
    cfg = gpu_config(workdir / "ckpt", trainIters=60, save_interval=100)
    cfg["training"]["precision"] = "fp16"
    run = run_trainer(cfg, workdir)
    assert run.returncode == 0, run.output[-4000:]
    assert "gradients overflowed at loss scale 4294967296.0; step skipped" in run.output
    losses = run.losses()
    assert sorted(losses) == list(range(1, 61))
    assert all(math.isfinite(v) for v in losses.values())
    assert losses[60] < losses[1] - 0.5, losses


def test_error_exit_with_the_persistent_writer_alive(workdir: Path) -> None:
    """An uncaught error after an async save: the rank kills its writer and exits 1 at once,
    instead of waiting forever in multiprocessing's exit handler."""
    cfg = gpu_config(workdir / "ckpt", trainIters=6, save_interval=2)
    cfg["checkpoint"].update(keep=0, **{"async": True})
    run = run_trainer(cfg, workdir, extra_env={INJECT_FAILURE: "3:0:RAISE"}, timeout=240)
    assert run.returncode == 1, run.output[-4000:]
    assert "checkpoint 2: async save started" in run.output
    assert "killing the async checkpoint writer" in run.output
    assert processes_with_env(str(workdir)) == []


def _fsdp_checkpoint_is_fsdp_dtensor(path: Path) -> None:
    from megatron_trainer.checkpoint import format_of, load_common

    assert (path / ".metadata").is_file() and not (path / "common.pt").exists()
    assert format_of(path) == "fsdp_dtensor"
    common = load_common(path)
    assert common["args"].ckpt_format == "fsdp_dtensor" and common["args"].use_megatron_fsdp
    assert common["trainer"]["checkpointFormat"] == "fsdp_dtensor"


def test_megatron_fsdp_trains_on_one_gpu(workdir: Path) -> None:
    """parallelism.fsdp: the model wrapped in Megatron FSDP (optim_grads_params) trains, saves
    fsdp_dtensor checkpoints and resumes from one; on CPU Megatron-Core 0.16.1's FSDP cannot run
    (it creates CUDA streams)."""
    cfg = gpu_config(workdir / "ckpt", trainIters=10, save_interval=5)
    cfg["parallelism"]["fsdp"] = True
    cfg["checkpoint"]["keep"] = 0
    run = run_trainer(cfg, workdir)
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(run.losses()) == list(range(1, 11))
    assert read_tracker(workdir / "ckpt") == 10
    _fsdp_checkpoint_is_fsdp_dtensor(iteration_dir(workdir / "ckpt", 5))
    # Resume from iteration 5: steps 6..10 again, as the uninterrupted run had them.
    shutil.rmtree(iteration_dir(workdir / "ckpt", 10))
    (workdir / "ckpt" / TRACKER).write_text("5\n")
    resumed = run_trainer(cfg, workdir, name="resumed")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "RESUME: loading checkpoint iteration 5" in resumed.output
    assert sorted(resumed.losses()) == list(range(6, 11))
    for i in range(6, 11):
        assert abs(resumed.losses()[i] - run.losses()[i]) < 1e-3, (
            i,
            resumed.losses(),
            run.losses(),
        )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="FSDP with DP >= 2 needs two GPUs")
def test_megatron_fsdp_with_data_parallel_2(workdir: Path) -> None:
    """Megatron FSDP over two data-parallel ranks, where its parameters are DTensor shards: the
    fresh start does not broadcast them, checkpoints are fsdp_dtensor, a resume at DP 2 goes on
    as the uninterrupted run, and the losses follow DDP's at DP 2 (bf16: not bit-identical)."""
    cfg = gpu_config(workdir / "ckpt", dp=2, trainIters=10, save_interval=5)
    cfg["parallelism"]["fsdp"] = True
    cfg["resources"]["procsPerNode"] = 2
    cfg["checkpoint"]["keep"] = 0
    run = run_trainer(cfg, workdir, name="fsdp-dp2")
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(run.losses()) == list(range(1, 11))
    _fsdp_checkpoint_is_fsdp_dtensor(iteration_dir(workdir / "ckpt", 5))
    shutil.rmtree(iteration_dir(workdir / "ckpt", 10))
    (workdir / "ckpt" / TRACKER).write_text("5\n")
    resumed = run_trainer(cfg, workdir, name="fsdp-dp2-resumed")
    assert resumed.returncode == 0, resumed.output[-4000:]
    for i in range(6, 11):
        assert abs(resumed.losses()[i] - run.losses()[i]) < 1e-3, (i, resumed.losses())
    ddp = gpu_config(workdir / "ddp", dp=2, trainIters=10, save_interval=100)
    ddp["resources"]["procsPerNode"] = 2
    reference = run_trainer(ddp, workdir, name="ddp-dp2")
    assert reference.returncode == 0, reference.output[-4000:]
    for i in range(1, 11):
        assert abs(run.losses()[i] - reference.losses()[i]) < 5e-2, (
            run.losses(),
            reference.losses(),
        )
