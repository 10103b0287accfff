"""Megatron-LM's own loader and saver on our checkpoints, both ways (docs/trainer.md, "Megatron-LM
reads our checkpoints"). Runs only where MEGATRON_LM_SRC names a Megatron-LM core_v0.16.1
checkout (tests/trainer/megatron_lm.py says why and what is shimmed for CPU).

For each layout (TP=2, PP=2, PP=2 with VPP=2, MoE with EP=2):
1. our trainer trains gpt-tiny 4 steps, saving at 2 and 4 (`dp_reshardable`);
2. Megatron-LM, started with the flags docs/trainer.md gives plus the layout's, builds its model,
   optimizer and scheduler and loads our iteration 2 (`--ckpt-step 2`) with its own
   `load_checkpoint`, then writes it back with its own `save_checkpoint`;
3. Megatron-LM's checkpoint equals ours: every weight, every optimizer tensor (fp32 main
   parameters, Adam moments, per bucket) and optimizer object, the scheduler, the iteration and
   the consumed samples. Anything its load skipped or misread would be saved differently;
4. the other direction: a MegatronJob starts from Megatron-LM's checkpoint through
   `checkpoint.init.megatron` (`load: full`) and its steps 3 and 4 have exactly the losses of the
   uninterrupted run.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from .megatron_lm import (
    SOURCE_ENV,
    checkout_view,
    documented_flags,
    run_megatron_lm,
    source_problem,
)
from .trainer_configs import TINY_MOE, tiny_config
from .trainer_runs import Run, run_trainer

_PROBLEM = source_problem()
pytestmark = [pytest.mark.trainer, pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))]

# name: (our tiny_config layout, Megatron-LM flags of the layout, MoE?)
LAYOUTS: dict[str, tuple[dict[str, Any], list[str], bool]] = {
    "tp2": ({"tp": 2}, ["--tensor-model-parallel-size", "2"], False),
    "pp2": ({"pp": 2}, ["--pipeline-model-parallel-size", "2"], False),
    "pp2-vpp2": (
        {"pp": 2, "vpp": 2},
        ["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"],
        False,
    ),
    "moe-ep2": ({"dp": 2}, ["--expert-model-parallel-size", "2"], True),
}


def our_config(ckpt: Path, layout: str) -> dict[str, Any]:
    ours, _, moe = LAYOUTS[layout]
    cfg = tiny_config(ckpt, trainIters=4, save_interval=2, **ours)
    cfg["checkpoint"]["keep"] = 0
    if moe:
        cfg["model"]["moe"] = TINY_MOE
        cfg["parallelism"].update(expert=2, expertData=1)
    return cfg


def contents(path: Path) -> dict[str, Any]:
    """Every tensor and object of a torch_dist iteration directory, as global values."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(path))
    metadata = reader.read_metadata()
    tensors = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        load(tensors, storage_reader=reader, no_dist=True)
    found: dict[str, Any] = dict(tensors)
    for index, info in metadata.storage_data.items():
        if index.fqn in tensors or index.fqn.startswith("rng_state"):
            continue  # the RNG state is not compared (--no-load-rng)
        with open(path / info.relative_path, "rb") as f:
            f.seek(info.offset)
            blob = f.read(info.length)
        found[index.fqn] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    return found


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    if isinstance(ours, torch.Tensor):
        assert isinstance(theirs, torch.Tensor), where
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, where
        assert torch.equal(ours, theirs), f"{where}: values differ"
    elif isinstance(ours, dict):
        assert isinstance(theirs, dict) and sorted(ours) == sorted(theirs), where
        for key in ours:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


@pytest.fixture(scope="module")
def megatron_lm_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MEGATRON_LM_SRC as a full clone lays it out (with Megatron-LM's own top-level `tests`
    package), whether or not it is one: every run below then also shows that package does not
    shadow ours."""
    import os

    return checkout_view(Path(os.environ[SOURCE_ENV]), tmp_path_factory.mktemp("megatron-lm"))


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def round_trip(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, megatron_lm_src: Path
) -> tuple[str, Path, Run, Path, int, str, list[dict[str, Any]]]:
    layout = request.param
    workdir = tmp_path_factory.mktemp(layout)
    ours = run_trainer(our_config(workdir / "ckpt", layout), workdir, name="ours")
    assert ours.returncode == 0, ours.output[-3000:]
    _, layout_flags, moe = LAYOUTS[layout]
    flags = [
        *documented_flags("gpt-tiny"),
        *(documented_flags("moe") if moe else []),
        *layout_flags,
        *["--load", str(workdir / "ckpt"), "--ckpt-step", "2", "--save", str(workdir / "mlm")],
    ]
    code, output, reports = run_megatron_lm(
        flags, world=2, workdir=workdir, name="mlm", source=megatron_lm_src
    )
    return layout, workdir, ours, workdir / "mlm", code, output, reports


def test_megatron_lm_loads_everything_of_ours(
    round_trip: tuple[str, Path, Run, Path, int, str, list[dict[str, Any]]],
) -> None:
    layout, workdir, _, mlm, code, output, reports = round_trip
    assert code == 0, output[-5000:]
    assert "successfully loaded checkpoint from" in output and "at iteration 2" in output
    assert len(reports) == 2
    for report in reports:
        assert report["iteration"] == 2
        assert report["consumed_train_samples"] == 2 * 8  # global batch 8
        assert report["scheduler"]["num_steps"] == 16
        assert report["model_chunks"] == (2 if layout == "pp2-vpp2" else 1)
    ours_dir, theirs_dir = workdir / "ckpt" / "iter_0000002", mlm / "iter_0000002"
    ours, theirs = contents(ours_dir), contents(theirs_dir)
    # Megatron-LM ran with --no-load-rng (a CPU checkpoint's "CUDA" RNG is a CPU generator
    # state), so it saved its own RNG state; everything else must be what it loaded.
    keys = sorted(k for k in ours if not k.startswith("rng_state"))
    assert keys == sorted(k for k in theirs if not k.startswith("rng_state"))
    # The optimizer state is there (under `chained_<i>.` with MoE's dense and expert optimizers).
    assert any(".optimizer." in f".{k}" and k.endswith(".exp_avg_sq") for k in keys)
    for key in keys:
        assert_same(ours[key], theirs[key], key)
    common_ours = torch.load(ours_dir / "common.pt", map_location="cpu", weights_only=False)
    common_theirs = torch.load(theirs_dir / "common.pt", map_location="cpu", weights_only=False)
    assert common_theirs["iteration"] == common_ours["iteration"] == 2
    assert_same(
        common_ours["opt_param_scheduler"], common_theirs["opt_param_scheduler"], "scheduler"
    )
    assert common_theirs["args"].consumed_train_samples == 16


def test_a_megatron_job_starts_from_megatron_lms_checkpoint(
    round_trip: tuple[str, Path, Run, Path, int, str, list[dict[str, Any]]],
) -> None:
    layout, workdir, ours, mlm, code, output, _ = round_trip
    assert code == 0, output[-5000:]
    cfg = our_config(workdir / "from-mlm", layout)
    cfg["checkpoint"]["init"] = {
        "huggingFace": None,
        "megatron": {"path": str(mlm), "load": "full"},
    }
    started = run_trainer(cfg, workdir, name="from-mlm")
    assert started.returncode == 0, started.output[-3000:]
    assert "INIT: everything of" in started.output and "continuing at iteration 3" in started.output
    losses = started.losses()
    assert sorted(losses) == [3, 4]
    assert losses == {i: ours.losses()[i] for i in (3, 4)}
