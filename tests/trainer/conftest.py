"""Tests of the trainer (trainer/megatron_trainer), marked `trainer`.

Strategy:
- Pure pieces (config parsing and validation, FLOPs, progress reports, checkpoint directory
  checks) are tested in-process.
- Everything that trains runs as pods do: `python -m megatron_trainer` subprocesses with the
  contract env (trainer_runs.py), on CPU with real gloo process groups and real torch_dist
  checkpoints. Nothing of Megatron-Core is mocked.
- The model is gpt-tiny as the contract's example config writes it (trainer_configs.py), trained
  for a few steps, so the whole directory stays within a few minutes on 2 cores.
- Runs that several tests compare against are made once per session (`reference_runs`).
- Every run records which CPU-platform patches it used (MEGATRON_CPU_PATCH_REPORT), which
  test_cpu_platform.py reads to show each patch is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .trainer_configs import tiny_config
from .trainer_runs import Run, run_trainer

# The layouts the acceptance criteria compare, all with the same seed and data.
REFERENCE_LAYOUTS: dict[str, dict[str, int]] = {
    "tp1": {},
    "tp2": {"tp": 2},
    "pp2": {"pp": 2},
    "pp2-vpp2": {"pp": 2, "vpp": 2},
    "dp2": {"dp": 2, "nodes": 2},  # two pods of one rank each: exercises NODE_RANK
}
REFERENCE_ITERS = 10


@pytest.fixture(scope="session")
def reference_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """`reference_runs("tp2")`: a finished 10-step run of gpt-tiny in that layout (cached)."""
    cache: dict[str, Run] = {}
    root = tmp_path_factory.mktemp("reference")

    def get(layout: str) -> Run:
        if layout not in cache:
            workdir = root / layout
            cfg = tiny_config(
                workdir / "ckpt", trainIters=REFERENCE_ITERS, **REFERENCE_LAYOUTS[layout]
            )
            run = run_trainer(cfg, workdir)
            assert run.returncode == 0, run.output[-5000:]
            cache[layout] = run
        return cache[layout]

    return get


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def pytest_configure(config: pytest.Config) -> None:
    # Registered here (not in pyproject's markers list) so the trainer tests own it; the
    # module marked `gpu` skips itself without CUDA.
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (tests/trainer/test_gpu.py)")
