"""NaN/Inf losses fail the step before any save, and pruning keeps a finite checkpoint
(issue 12, items 4 and 12).

The NaN is injected on CPU through MEGATRON_INJECT_NAN_LOSS into a real gloo run; pruning runs
on that run's real torch_dist checkpoints.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import torch

from megatron_contract.env import INJECT_FAILURE, INJECT_NAN_LOSS
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode
from megatron_trainer.checkpoint import (
    Pruner,
    checkpoints_to_prune,
    iteration_dir,
    read_loss,
    read_tracker,
    remove_dir,
    scan,
)
from megatron_trainer.numerics import (
    is_non_finite_grad_error,
    nan_injection_iteration,
)

from .trainer_configs import tiny_config
from .trainer_runs import processes_with_env, run_trainer

pytestmark = pytest.mark.trainer


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """PP=2 (the loss lives on the last stage only), a checkpoint every step, NaN at step 4."""
    workdir = tmp_path_factory.mktemp("nan")
    cfg = tiny_config(workdir / "ckpt", pp=2, trainIters=6, save_interval=1)
    cfg["checkpoint"]["keep"] = 0
    run = run_trainer(cfg, workdir, extra_env={INJECT_NAN_LOSS: "4"})
    return workdir / "ckpt", run.returncode, run.output


def test_nan_loss_fails_the_step_before_any_save(nan_run: tuple[Path, int, str]) -> None:
    ckpt, code, output = nan_run
    assert code == ExitCode.NON_FINITE, output[-3000:]
    assert "the loss of a micro-batch is nan" in output
    assert f"exiting with {int(ExitCode.NON_FINITE)}" in output
    # Steps 1-3 were saved; step 4 never reached its save (not even a partial directory).
    assert scan(ckpt).complete == [1, 2, 3]
    assert not iteration_dir(ckpt, 4).exists()
    assert read_tracker(ckpt) == 3
    # Each checkpoint records its step's (finite) loss, which pruning reads.
    losses = [read_loss(iteration_dir(ckpt, i)) for i in (1, 2, 3)]
    assert all(loss is not None and 6.0 < loss < 7.5 for loss in losses), losses


def _set_loss(path: Path, loss: float) -> None:
    common = torch.load(path / "common.pt", map_location="cpu", weights_only=True)
    common["trainer"]["loss"] = loss
    torch.save(common, path / "common.pt")


def test_pruning_runs_in_the_background_and_keeps_the_newest_finite_checkpoint(
    nan_run: tuple[Path, int, str], tmp_path: Path
) -> None:
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(nan_run[0], ckpt)
    _set_loss(iteration_dir(ckpt, 3), math.nan)  # as if step 3 had saved a NaN loss

    release = threading.Event()
    removed: list[str] = []

    def slow_remove(path: str) -> None:  # a network filesystem taking its time
        release.wait(30)
        removed.append(Path(path).name)
        remove_dir(path)

    pruner = Pruner(ckpt, keep=1, remove=slow_remove)
    started = time.monotonic()
    future = pruner.submit(3)
    assert time.monotonic() - started < 0.5  # the caller (inside a collective) does not wait
    time.sleep(0.2)
    assert not future.done() and removed == []
    release.set()
    pruner.close()
    # keep: 1 keeps 3 (newest); 2 stays too, as the newest checkpoint with a finite loss.
    assert future.result() == [1]
    assert scan(ckpt).complete == [2, 3]


def test_prune_choice() -> None:
    nan = math.nan
    losses = {2: 5.0, 4: 4.9, 6: nan, 8: None}
    assert checkpoints_to_prune([2, 4, 6, 8], 2, losses) == [2]
    assert checkpoints_to_prune([2, 4, 6, 8], 3, losses) == [2]
    assert checkpoints_to_prune([2, 4, 6, 8], 1, {i: 1.0 for i in (2, 4, 6, 8)}) == [2, 4, 6]
    assert checkpoints_to_prune([2, 4, 6, 8], 0, losses) == []
    assert checkpoints_to_prune([2, 4], 1, {2: nan, 4: math.inf}) == [2]  # nothing finite


def test_megatron_cores_grad_check_error_is_recognised() -> None:
    from megatron.core.rerun_state_machine import get_rerun_state_machine

    # What DDP's check_for_nan_in_grad raises (reruns disabled). It reports the CUDA device,
    # so outside the CPU platform's patches it can only be produced with a GPU; the message
    # format is Megatron-Core's, copied from rerun_state_machine.validate_result.
    machine = get_rerun_state_machine()
    assert machine.mode.name == "DISABLED"
    err = RuntimeError(
        "Rank 0, node n, device 0, iteration 4: Unexpected result tensor(nan) "
        "(message='found NaN in local grad norm for bucket #0 in backward pass before "
        "data-parallel communication collective')"
    )
    assert is_non_finite_grad_error(err)
    assert not is_non_finite_grad_error(RuntimeError("CUDA out of memory"))


def test_nan_injection_env() -> None:
    assert nan_injection_iteration({}) is None
    assert nan_injection_iteration({INJECT_NAN_LOSS: "7"}) == 7
    with pytest.raises(ConfigError, match=INJECT_NAN_LOSS):
        nan_injection_iteration({INJECT_NAN_LOSS: "soon"})


# -- error exits with the persistent async-save writer alive --------------------------------


@pytest.mark.parametrize(
    ("injection", "code", "says"),
    [
        ({INJECT_NAN_LOSS: "3"}, ExitCode.NON_FINITE, "the loss of a micro-batch is nan"),
        ({INJECT_FAILURE: "3:0:RAISE"}, 1, "InjectedFailure: MEGATRON_INJECT_FAILURE"),
    ],
    ids=["nan", "uncaught-error"],
)
def test_error_exit_with_the_async_writer_alive(
    workdir: Path, injection: dict[str, str], code: int, says: str
) -> None:
    """The persistent writer (the same one GPU runs use) is a non-daemon process waiting in
    queue.get(), which multiprocessing's exit handler joins: unless the rank kills it on the
    way out, the rank never exits (and its peers wait out the collective timeout). One rank,
    an async save at step 2, the failure at step 3."""
    cfg = tiny_config(workdir / "ckpt", trainIters=6, save_interval=2)
    cfg["checkpoint"].update(keep=0, **{"async": True})
    run = run_trainer(cfg, workdir, extra_env=injection, timeout=150)
    assert run.returncode == code, run.output[-3000:]
    assert says in run.output
    assert "checkpoint 2: async save started" in run.output
    assert "killing the async checkpoint writer" in run.output
    assert processes_with_env(str(workdir)) == []


def test_a_non_finite_gradient_norm_fails_an_applied_step() -> None:
    """Megatron FSDP does not check gradients before its reduce-scatter: the norm the optimizer
    computes is the check there (loop.train_step)."""
    from megatron_trainer.numerics import NonFiniteLoss, check_grad_norm

    check_grad_norm(True, 1.5)
    check_grad_norm(False, float("nan"))  # fp16's loss scaler skipped the step: its business
    check_grad_norm(True, None)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteLoss, match="gradient norm of this step is"):
            check_grad_norm(True, bad)
