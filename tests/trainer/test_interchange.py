"""Our checkpoints as Megatron-LM reads them, per-stage seeds, per-save sharding and the LR
schedule on resume (issue 12: Interchange, items 8, 9 and 11).

One PP=2 gloo run (3 steps, saves at 2 and 3) provides the checkpoints; a second run resumes it
with a longer schedule.
"""

from __future__ import annotations

import re
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from megatron_trainer.checkpoint import iteration_dir
from megatron_trainer.interchange import ARCHITECTURE_ARGS

from .megatron_lm_reader import MegatronLMRefuses, plan_load, run_args
from .trainer_configs import tiny_config
from .trainer_runs import Run, run_trainer

pytestmark = pytest.mark.trainer

ITERS = 3


@pytest.fixture(scope="module")
def pp2_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    workdir = tmp_path_factory.mktemp("pp2")
    cfg = tiny_config(workdir / "ckpt", pp=2, trainIters=ITERS, save_interval=2)
    cfg["checkpoint"].update(keep=0, shardingType="fully_reshardable")
    run = run_trainer(cfg, workdir, name="first")
    assert run.returncode == 0, run.output[-3000:]
    return workdir, run


def common(path: Path) -> dict[str, object]:
    return dict(torch.load(path / "common.pt", map_location="cpu", weights_only=True))


# -- Interchange: Megatron-LM's loader ------------------------------------------------------


def test_megatron_lm_resumes_our_checkpoint_on_the_same_layout(
    pp2_run: tuple[Path, Run],
) -> None:
    ckpt = pp2_run[0] / "ckpt"
    plan = plan_load(ckpt, run_args(pipeline_model_parallel_size=2))
    assert plan.iteration == ITERS
    assert plan.checkpoint_version == 3.0
    assert plan.consumed_train_samples == ITERS * 8  # global batch 8
    assert plan.loads_rng and plan.loads_optimizer
    assert plan.sharding_type == "fully_reshardable"  # the final save
    assert sorted(plan.rng) == [(0, 0), (1, 0)]  # (pp, tp) shards


def test_megatron_lm_flags_that_read_it(pp2_run: tuple[Path, Run]) -> None:
    ckpt = pp2_run[0] / "ckpt"
    # --finetune: weights only, iteration 0, no args check, no optimizer or RNG.
    plan = plan_load(ckpt, run_args(finetune=True, tensor_model_parallel_size=2))
    assert (plan.iteration, plan.loads_rng, plan.loads_optimizer) == (0, False, False)
    # --no-load-rng / --no-load-optim
    plan = plan_load(ckpt, run_args(pipeline_model_parallel_size=2, no_load_rng=True))
    assert not plan.loads_rng and plan.loads_optimizer
    # Another TP/PP: RNG ignored; the fully_reshardable optimizer reshards.
    plan = plan_load(ckpt, run_args(tensor_model_parallel_size=2))
    assert not plan.loads_rng and plan.loads_optimizer
    assert "RNG state will be ignored" in plan.messages
    # --ckpt-step 2 picks the periodic save: dp_reshardable, so a TP/PP change is refused
    # unless the optimizer is left out.
    with pytest.raises(MegatronLMRefuses, match="sharding type dp_reshardable"):
        plan_load(ckpt, run_args(tensor_model_parallel_size=2, ckpt_step=2))
    plan = plan_load(ckpt, run_args(tensor_model_parallel_size=2, ckpt_step=2, no_load_optim=True))
    assert plan.iteration == 2
    # Without --use-dist-ckpt (or --auto-detect-ckpt-format) Megatron-LM refuses torch_dist.
    with pytest.raises(MegatronLMRefuses, match="--use-dist-ckpt"):
        plan_load(ckpt, run_args(use_dist_ckpt=False))
    # A different architecture fails check_checkpoint_args, naming the field.
    with pytest.raises(MegatronLMRefuses, match="num_layers value from checkpoint"):
        plan_load(ckpt, run_args(pipeline_model_parallel_size=2, num_layers=8))


def test_args_hold_what_use_checkpoint_args_copies(pp2_run: tuple[Path, Run]) -> None:
    args = common(iteration_dir(pp2_run[0] / "ckpt", ITERS))["args"]
    assert isinstance(args, Namespace)
    missing = [name for name in ARCHITECTURE_ARGS if not hasattr(args, name)]
    assert missing == []
    assert (args.num_query_groups, args.kv_channels, args.swiglu) == (2, 32, True)
    assert (args.ckpt_format, args.use_distributed_optimizer) == ("torch_dist", True)
    assert args.untie_embeddings_and_output_weights is True
    flops = common(iteration_dir(pp2_run[0] / "ckpt", ITERS))[
        "num_floating_point_operations_so_far"
    ]
    assert isinstance(flops, float) and flops > 0


# -- item 8: each pipeline stage has its own seed ---------------------------------------------


def test_pipeline_stages_are_seeded_apart(pp2_run: tuple[Path, Run]) -> None:
    plan = plan_load(pp2_run[0] / "ckpt", run_args(pipeline_model_parallel_size=2))
    stage0, stage1 = plan.rng[(0, 0)][0], plan.rng[(1, 0)][0]
    # seed + 100·pp_rank (Megatron-LM's _set_random_seed): the stages' generators differ, so on
    # GPU, where weights are drawn from them, the stages do not start from identical weights.
    assert not torch.equal(stage0["torch_rng_state"], stage1["torch_rng_state"])
    tracker0, tracker1 = stage0["rng_tracker_states"], stage1["rng_tracker_states"]
    assert sorted(tracker0) == sorted(tracker1) and tracker0
    assert all(not torch.equal(tracker0[k], tracker1[k]) for k in tracker0)
    assert stage0["np_rng_state"][1][:4].tolist() != stage1["np_rng_state"][1][:4].tolist()


# -- item 11: fully_reshardable only for the final save ---------------------------------------


def test_periodic_saves_are_dp_reshardable_and_the_final_one_fully(
    pp2_run: tuple[Path, Run],
) -> None:
    ckpt = pp2_run[0] / "ckpt"
    assert common(iteration_dir(ckpt, 2))["trainer"]["shardingType"] == "dp_reshardable"  # type: ignore[index]
    assert common(iteration_dir(ckpt, ITERS))["trainer"]["shardingType"] == "fully_reshardable"  # type: ignore[index]
    assert "checkpoint 2 complete" in pp2_run[1].output


# -- item 9: a longer schedule on resume takes effect -----------------------------------------


def _lr_by_iteration(output: str) -> dict[int, float]:
    return {
        int(m.group(1)): float(m.group(2))
        for m in re.finditer(r"iteration (\d+)/\d+ \| loss \S+ \| lr (\S+)", output)
    }


def test_raising_train_iters_on_resume_changes_the_schedule(pp2_run: tuple[Path, Run]) -> None:
    workdir = pp2_run[0]
    longer = tiny_config(workdir / "ckpt", pp=2, trainIters=2 * ITERS, save_interval=100)
    longer["checkpoint"].update(keep=0, shardingType="fully_reshardable")
    resumed = run_trainer(longer, workdir, name="longer")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "RESUME: loading checkpoint iteration 3" in resumed.output
    gbs = 8
    assert (
        f"lr_decay_steps: {ITERS * gbs} -> {2 * ITERS * gbs}; wd_incr_steps: {ITERS * gbs} -> "
        f"{2 * ITERS * gbs}; continuing with this job's schedule from step {ITERS * gbs}"
    ) in resumed.output
    # The spec's cosine decay over 6 iterations: at iteration 4 (3 of 4 decay iterations done
    # after 2 warm-up) the LR is still well above min_lr; with the checkpoint's 3-iteration
    # schedule it would be min_lr (1e-4) from here on.
    lrs = _lr_by_iteration(resumed.output)
    assert sorted(lrs) == [4, 5, 6]
    expected = _cosine_lr(iteration=4, train_iters=2 * ITERS)
    assert lrs[4] == pytest.approx(expected, rel=1e-3)
    assert lrs[4] > 2e-4


def _cosine_lr(iteration: int, train_iters: int) -> float:
    """Megatron-Core's cosine schedule after `iteration` steps (warm-up 2, lr 1e-3 → 1e-4)."""
    import math

    warmup, max_lr, min_lr = 2, 1e-3, 1e-4
    ratio = (iteration - warmup) / (train_iters - warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1.0)
