"""Resume: exactly where a killed or stopped job left off, from the newest complete checkpoint.

All runs go through `python -m megatron_trainer` (the launcher) with gloo ranks and real
torch_dist checkpoints; failures are injected with MEGATRON_INJECT_FAILURE, which fires inside
the rank right after the given step, so the tests do not depend on timing.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from megatron_trainer.checkpoint import (
    TRACKER,
    incomplete_reason,
    iteration_dir,
    read_tracker,
    scan,
)

from .conftest import REFERENCE_ITERS
from .trainer_configs import tiny_config
from .trainer_runs import Run, processes_with_env, relative_difference, run_trainer, start_trainer

pytestmark = pytest.mark.trainer


def test_exact_resume_after_sigkill_of_one_rank(workdir: Path) -> None:
    cfg = tiny_config(workdir / "ckpt", tp=2, trainIters=20, save_interval=5)
    full = run_trainer(tiny_config(workdir / "full", tp=2, trainIters=20), workdir, name="full")
    assert full.returncode == 0, full.output[-3000:]

    killed = run_trainer(cfg, workdir, extra_env={"MEGATRON_INJECT_FAILURE": "12:1"}, name="killed")
    # The launcher saw rank 1 die by SIGKILL, stopped rank 0 and exited 128 + 9.
    assert killed.returncode == 137, killed.output[-3000:]
    assert "local rank 1 exited with 137; stopping the others" in killed.output
    assert max(killed.losses()) == 12
    assert processes_with_env(str(workdir / "killed-config.json")) == []  # nothing left behind
    assert read_tracker(workdir / "ckpt") == 10

    resumed = run_trainer(cfg, workdir, name="resumed")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "RESUME: loading checkpoint iteration 10" in resumed.output
    after = resumed.losses()
    assert sorted(after) == list(range(11, 21))
    expected = {i: full.losses()[i] for i in range(11, 21)}
    assert after == expected  # bit-identical, not merely close
    assert scan(workdir / "ckpt").complete == [10, 15, 20]  # keep: 3


def test_sigterm_saves_the_current_step_and_resume_continues_after_it(
    workdir: Path, reference_runs: Callable[[str], Run]
) -> None:
    cfg = tiny_config(workdir / "ckpt", tp=2, trainIters=REFERENCE_ITERS)
    # Rank 0 sends SIGTERM to its launcher right after step 7, as the kubelet would.
    stopped = run_trainer(
        cfg, workdir, extra_env={"MEGATRON_INJECT_FAILURE": "7:0:TERM"}, name="stopped"
    )
    assert stopped.returncode == 143, stopped.output[-3000:]
    assert incomplete_reason(iteration_dir(workdir / "ckpt", 7)) is None
    assert read_tracker(workdir / "ckpt") == 7
    assert stopped.progress[-1]["checkpointIteration"] == 7
    assert max(stopped.losses()) == 7

    resumed = run_trainer(cfg, workdir, name="resumed")
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "RESUME: continuing at iteration 8" in resumed.output
    after = resumed.losses()
    assert sorted(after) == [8, 9, 10]
    reference = reference_runs("tp2").losses()
    assert after == {i: reference[i] for i in (8, 9, 10)}


def test_sigterm_to_the_launcher_checkpoints_and_exits_143(workdir: Path) -> None:
    cfg = tiny_config(workdir / "ckpt", trainIters=200, save_interval=100)
    cfg["profiling"] = {"tool": "torch", "startStep": 1, "endStep": 2, "ranks": [0]}
    pods = start_trainer(cfg, workdir)
    deadline = time.monotonic() + 180
    while not any(r["iteration"] >= 2 for r in pods.progress()):
        assert time.monotonic() < deadline and pods.procs[0].poll() is None, "no progress"
        time.sleep(0.2)
    sent = time.monotonic()
    pods.procs[0].send_signal(signal.SIGTERM)
    run = pods.wait(timeout=120)
    assert run.returncode == 143, run.output[-3000:]
    assert time.monotonic() - sent < 60  # well inside a pod's grace period
    stopped_at = run.progress[-1]["iteration"]
    assert run.progress[-1]["checkpointIteration"] == stopped_at < 200
    assert read_tracker(workdir / "ckpt") == stopped_at
    # The profiler window of attempt 0 (MEGATRON_RESTART_ATTEMPT), rank 0: one capture.
    assert (workdir / "ckpt" / "profiles" / "0" / "rank0.torch.json").stat().st_size > 0


def test_incomplete_or_truncated_latest_checkpoint_is_skipped(workdir: Path) -> None:
    ckpt = workdir / "ckpt"
    cfg = tiny_config(ckpt, trainIters=6, warmupIters=1, save_interval=3)
    first = run_trainer(cfg, workdir, name="first")
    assert first.returncode == 0, first.output[-3000:]
    assert read_tracker(ckpt) == 6
    # iter 6 loses the end of a shard (a copy cut short); iter 9 is a save that was cut off.
    shard = max(iteration_dir(ckpt, 6).glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:100])
    partial = iteration_dir(ckpt, 9)
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"partial")

    again = run_trainer(cfg, workdir, name="again")
    assert again.returncode == 0, again.output[-3000:]
    assert f"checkpoint {iteration_dir(ckpt, 6)} is incomplete: shard file" in again.output
    assert "is truncated" in again.output
    # Neither format's finished marker: torch_dist's common.pt/metadata.json, DCP's .metadata.
    assert f"checkpoint {partial} is incomplete: .metadata is missing" in again.output
    # The tracker still names the deleted iteration 6; it is not trusted over the directories.
    assert f"{TRACKER} says 6 but the newest complete checkpoint is 3" in again.output
    assert "RESUME: loading checkpoint iteration 3" in again.output
    assert not partial.exists()
    assert again.losses() == {i: first.losses()[i] for i in (4, 5, 6)}
    assert incomplete_reason(iteration_dir(ckpt, 6)) is None and read_tracker(ckpt) == 6

    cfg["checkpoint"]["load"] = False
    fresh = run_trainer(cfg, workdir, name="fresh")
    assert fresh.returncode == 0, fresh.output[-3000:]
    assert "checkpoint.load is false: NOT resuming" in fresh.output
    assert fresh.losses() == first.losses()  # from scratch, and deterministic
    assert len(list(ckpt.glob("discarded-*/iter_0000006"))) == 1


def test_dp_change_resumes_and_incompatible_changes_fail_clearly(
    workdir: Path, reference_runs: Callable[[str], Run]
) -> None:
    ckpt = workdir / "ckpt"
    killed = run_trainer(
        tiny_config(ckpt, dp=2, trainIters=REFERENCE_ITERS),
        workdir,
        extra_env={"MEGATRON_INJECT_FAILURE": "7:1"},
        name="dp2",
    )
    assert killed.returncode == 137 and read_tracker(ckpt) == 5, killed.output[-3000:]

    one = run_trainer(tiny_config(ckpt, dp=1, trainIters=REFERENCE_ITERS), workdir, name="dp1")
    assert one.returncode == 0, one.output[-3000:]
    assert "RESUME: loading checkpoint iteration 5" in one.output
    # Megatron-LM's layout: the RNG state is per (PP, TP) rank and DP ranks are replicas, so it
    # is restored across a DP change.
    assert "RNG states are not restored" not in one.output
    reference = reference_runs("dp2").losses()
    assert relative_difference(one.losses(), {i: reference[i] for i in range(6, 11)}) <= 1e-5

    tp2 = run_trainer(tiny_config(ckpt, tp=2, trainIters=REFERENCE_ITERS), workdir, name="tp2")
    assert tp2.returncode == 78, tp2.output[-3000:]
    assert "saved with tensor=1" in tp2.output and "fully_reshardable" in tp2.output

    wider = tiny_config(ckpt, trainIters=REFERENCE_ITERS)
    wider["model"].update(hiddenSize=256, kvChannels=64)
    other = run_trainer(wider, workdir, name="other-model")
    assert other.returncode == 78, other.output[-3000:]
    assert "model.hiddenSize: the checkpoint in" in other.output
    assert "trained with 128, this job has 256" in other.output

    bigger_batch = run_trainer(
        tiny_config(ckpt, trainIters=REFERENCE_ITERS, globalBatchSize=16, numMicrobatches=8),
        workdir,
        name="gbs",
    )
    assert bigger_batch.returncode == 78, bigger_batch.output[-3000:]
    assert "global batch size must stay fixed across a resume" in bigger_batch.output
    for run in (tp2, other, bigger_batch):
        assert "Traceback" not in run.output
