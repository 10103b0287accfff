"""checkpoint.init.megatron: our trainer trains gpt-tiny (a Llama) at TP=2 and saves torch_dist;
load_megatron_weights reads that checkpoint at TP=1 and PP=2. Reference: `transformers` running
the same checkpoint after export. Also the export's refusals and the path rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from megatron_contract.errors import ConfigError
from megatron_trainer.export import ExportError, export_hf, main
from megatron_trainer.init_weights import resolve_checkpoint

from .hf_ranks import hf_logits, read_safetensors, run_ranks
from .trainer_configs import tiny_config
from .trainer_runs import run_trainer

pytestmark = pytest.mark.trainer
SEQ = 128  # gpt-tiny's seqLength


@pytest.fixture(scope="module")
def trained_tp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint directory of 2 training steps of gpt-tiny at TP=2 (saved at 1 and 2)."""
    workdir = tmp_path_factory.mktemp("tp2")
    cfg = tiny_config(workdir / "ckpt", tp=2, trainIters=2, warmupIters=1, save_interval=1)
    cfg["checkpoint"]["keep"] = 0
    run = run_trainer(cfg, workdir)
    assert run.returncode == 0, run.output[-5000:]
    return workdir / "ckpt"


@pytest.fixture(scope="module")
def exported(trained_tp2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "hf"
    assert Path(export_hf(trained_tp2, out)).name == "iter_0000002"
    return out


@pytest.mark.parametrize("layout", [{}, {"pp": 2}], ids=["tp1", "pp2"])
def test_weights_from_a_tp2_checkpoint(
    layout: dict[str, int], trained_tp2: Path, exported: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    cfg = tiny_config(tmp_path / "ckpt", **layout)
    run_ranks(
        cfg,
        [
            {"op": "load_megatron", "path": str(trained_tp2)},
            {"op": "logits", "out": str(tmp_path / "megatron.pt")},
            {"op": "import_hf", "dir": str(exported)},
            {"op": "logits", "out": str(tmp_path / "hf.pt")},
        ],
        tmp_path / "ranks",
    )
    from_megatron = torch.load(tmp_path / "megatron.pt")
    reference = hf_logits(exported, SEQ)
    assert from_megatron.shape == reference.shape == (2, SEQ, 1024)
    assert (from_megatron - reference).abs().max().item() <= 1e-4
    # Both init paths give the same weights, so the same logits exactly.
    assert torch.equal(torch.load(tmp_path / "hf.pt"), from_megatron)


def test_export_picks_iterations_and_shards(trained_tp2: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert Path(export_hf(trained_tp2, first, iteration=1)).name == "iter_0000001"
    sharded = tmp_path / "sharded"
    export_hf(trained_tp2, sharded, iteration=1, max_shard_bytes=1_000_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((sharded / f).is_file() for f in files)
    single, split = read_safetensors(first), read_safetensors(sharded)
    assert sorted(single) == sorted(split)
    assert all(torch.equal(single[k], split[k]) for k in single)
    # Without --iteration the tracker's newest (2), one training step later: other weights.
    newest = tmp_path / "newest"
    assert main(["--hf", str(trained_tp2), "--output", str(newest)]) == 0
    later = read_safetensors(newest)
    assert not torch.equal(later["model.layers.0.self_attn.q_proj.weight"],
                           single["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip


def test_export_refuses_clearly(
    trained_tp2: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ExportError, match="no such directory"):
        export_hf(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"no readable latest_checkpointed_iteration\.txt"):
        export_hf(tmp_path / "empty", tmp_path / "out")
    with pytest.raises(
        ExportError, match=r"iteration 7 has no checkpoint .* complete checkpoints: 1, 2"
    ):
        export_hf(trained_tp2, tmp_path / "out", iteration=7)
    broken = tmp_path / "broken"
    shutil.copytree(trained_tp2, broken)
    (broken / "iter_0000002" / "metadata.json").unlink()
    with pytest.raises(ExportError, match=r"incomplete checkpoint: metadata\.json is missing"):
        export_hf(broken, tmp_path / "out")
    # The same through the command line: exit 2 and one line, no traceback.
    assert main(["--hf", str(broken), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mjob export: error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_export_refuses_models_that_are_not_llama(trained_tp2: Path, tmp_path: Path) -> None:
    # The checkpoint's own record of its model says what it is; a MoE or MLA record is refused
    # before any tensor is read.
    for field, value in (("moe", {"numExperts": 8}), ("mla", {"kvLoraRank": 32})):
        copy_dir = tmp_path / field
        shutil.copytree(trained_tp2, copy_dir)
        common_path = copy_dir / "iter_0000002" / "common.pt"
        common = torch.load(common_path, weights_only=False)
        common["trainer"]["model"][field] = value
        torch.save(common, common_path)
        with pytest.raises(
            ExportError, match=f"cannot export as a Hugging Face Llama model: .*model.{field}"
        ):
            export_hf(copy_dir, tmp_path / f"{field}-out")


def test_init_path_rules(trained_tp2: Path, tmp_path: Path) -> None:
    assert Path(resolve_checkpoint(trained_tp2)).name == "iter_0000002"  # the tracker's
    assert Path(resolve_checkpoint(trained_tp2 / "iter_0000001")).name == "iter_0000001"
    with pytest.raises(ConfigError, match=r"checkpoint.init.megatron.path: .* is not a directory"):
        resolve_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is not a torch_dist checkpoint"):
        resolve_checkpoint(tmp_path)
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "latest_checkpointed_iteration.txt").write_text("5\n")
    with pytest.raises(ConfigError, match="names iter_0000005, which is missing"):
        resolve_checkpoint(stale)
    partial = tmp_path / "partial"
    shutil.copytree(trained_tp2 / "iter_0000001", partial)
    (partial / ".metadata").unlink()
    with pytest.raises(ConfigError, match=r"not a complete checkpoint: .metadata is missing"):
        resolve_checkpoint(partial)


@pytest.fixture(scope="module")
def trained_reshardable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """3 steps of gpt-tiny at TP=2 with a fully_reshardable save at 2, and its losses.

    Only a run's final save is fully_reshardable (periodic saves stay dp_reshardable), so the
    run is stopped by SIGTERM after step 2 (that save) and then resumed for step 3."""
    workdir = tmp_path_factory.mktemp("tp2-full")
    cfg = tiny_config(workdir / "ckpt", tp=2, trainIters=3, save_interval=5)
    cfg["checkpoint"].update(keep=0, shardingType="fully_reshardable")
    stopped = run_trainer(cfg, workdir, extra_env={"MEGATRON_INJECT_FAILURE": "2:0:TERM"})
    assert stopped.returncode == 143, stopped.output[-5000:]
    run = run_trainer(cfg, workdir, name="resumed")
    assert run.returncode == 0, run.output[-5000:]
    return workdir / "ckpt", {**stopped.losses(), **run.losses()}


def test_full_load_continues_the_source_run_at_another_layout(
    trained_reshardable: tuple[Path, dict[int, float]], tmp_path: Path
) -> None:
    source, losses = trained_reshardable
    cfg = tiny_config(tmp_path / "ckpt", trainIters=3)  # TP=1, the source's schedule
    run_ranks(
        cfg,
        [
            {"op": "load_full", "path": str(source / "iter_0000002")},
            {"op": "train_step", "out": str(tmp_path / "loss.json")},
        ],
        tmp_path / "ranks",
    )
    loss = json.loads((tmp_path / "loss.json").read_text())
    # Step 3 after the optimizer state and data position of step 2: the source's own step 3
    # (other layouts agree to 1e-5, tests/trainer/test_layouts.py).
    assert abs(loss - losses[3]) / losses[3] <= 1e-5, (loss, losses)


def test_full_load_refuses_a_layout_change_of_dp_reshardable_state(
    trained_tp2: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(tmp_path / "ckpt")  # TP=1; trained_tp2 saved dp_reshardable at TP=2
    error = tmp_path / "error.txt"
    run_ranks(
        cfg, [{"op": "load_full", "path": str(trained_tp2), "error_out": str(error)}], tmp_path
    )
    assert "'full' cannot change tensor/pipeline parallelism" in error.read_text()
    assert "dp_reshardable at tensor=2, pipeline=1" in error.read_text()
