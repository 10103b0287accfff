"""What our checkpoints hold for Megatron-LM (its own loader runs in test_megatron_lm.py),
per-stage seeds, per-save sharding and the LR schedule on resume.

One PP=2 gloo run (3 steps, saves at 2 and 3) provides the checkpoints; a second run resumes it
with a longer schedule.
"""

from __future__ import annotations

import io
import re
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from megatron_trainer.checkpoint import iteration_dir
from megatron_trainer.interchange import ARCHITECTURE_ARGS

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


def sharded_objects(checkpoint: Path, key: str) -> dict[tuple[int, ...], Any]:
    """The ShardedObject `key` of every rank, by global offset, read from the .distcp files (the
    torch_dist strategy stores each as a torch.save'd list of one object)."""
    metadata = FileSystemReader(str(checkpoint)).read_metadata()
    found = {}
    for index, info in metadata.storage_data.items():
        if not index.fqn.startswith(f"{key}/shard_"):
            continue
        offset = tuple(int(x) for x in index.fqn.split("shard_")[1].split("_")[0].split("."))
        with open(checkpoint / info.relative_path, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        (found[offset],) = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    return found


def common(path: Path) -> dict[str, object]:
    return dict(torch.load(path / "common.pt", map_location="cpu", weights_only=True))


# -- Interchange: what Megatron-LM's loader reads (its own code runs in test_megatron_lm.py) ------


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
    rng = sharded_objects(iteration_dir(pp2_run[0] / "ckpt", ITERS), "rng_state")
    assert sorted(rng) == [(0, 0), (1, 0)]  # (pp, tp) shards, as Megatron-LM's get_rng_state
    stage0, stage1 = rng[(0, 0)][0], rng[(1, 0)][0]
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


def test_raising_train_iters_and_lr_on_resume_changes_the_schedule(
    pp2_run: tuple[Path, Run],
) -> None:
    """The spec's schedule applies from the checkpoint's step: a longer decay, and a changed
    lr/minLr (the optimizer's param groups hold the checkpoint's, which Megatron-Core's get_lr
    prefers, so those are replaced too)."""
    workdir = pp2_run[0]
    longer = tiny_config(
        workdir / "ckpt", pp=2, trainIters=2 * ITERS, save_interval=100, lr=2e-3, minLr=2e-4
    )
    longer["checkpoint"].update(keep=0, shardingType="fully_reshardable")
    resumed = run_trainer(longer, workdir, name="longer")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "RESUME: loading checkpoint iteration 3" in resumed.output
    gbs = 8
    assert (
        f"max_lr: 0.001 -> 0.002; min_lr: 0.0001 -> 0.0002; lr_decay_steps: {ITERS * gbs} -> "
        f"{2 * ITERS * gbs}; wd_incr_steps: {ITERS * gbs} -> {2 * ITERS * gbs}; continuing "
        f"with this job's schedule from step {ITERS * gbs}"
    ) in resumed.output
    # The spec's cosine decay over 6 iterations: at iteration 4 (3 of 4 decay iterations done
    # after 2 warm-up) the LR is still well above min_lr; with the checkpoint's 3-iteration
    # schedule it would be min_lr (1e-4) from here on.
    lrs = _lr_by_iteration(resumed.output)
    assert sorted(lrs) == [4, 5, 6]
    for iteration in (4, 5, 6):
        expected = _cosine_lr(iteration, train_iters=2 * ITERS, max_lr=2e-3, min_lr=2e-4)
        assert lrs[iteration] == pytest.approx(expected, rel=1e-3)
    assert lrs[4] > 1e-3  # above the checkpoint's max_lr: the new lr took effect


def _cosine_lr(iteration: int, train_iters: int, max_lr: float, min_lr: float) -> float:
    """Megatron-Core's cosine schedule after `iteration` steps (warm-up 2)."""
    import math

    warmup = 2
    ratio = (iteration - warmup) / (train_iters - warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1.0)
