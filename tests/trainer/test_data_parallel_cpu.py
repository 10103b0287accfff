"""Data parallelism 2 on two gloo rank processes (dp_ranks.py), one pair for every check:

- Megatron FSDP as far as it runs without CUDA: parameters held as DTensor shards, as Megatron
  FSDP holds them once it has wrapped a model, through the trainer's own start-up and checkpoint
  code. Megatron FSDP itself needs CUDA streams (test_fsdp_config.py); it trains in test_gpu.py.
- DDP's gradient buckets rebuilt from a checkpoint's recorded size, through Megatron-Core's own
  DistributedDataParallelConfig and DDP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.ports import free_port

pytestmark = pytest.mark.trainer

RANKS = Path(__file__).with_name("dp_ranks.py")
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every check of dp_ranks.py, run once on two ranks; what each rank saw."""
    workdir = tmp_path_factory.mktemp("dp-ranks")
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(RANKS), str(rank), str(WORLD), port, str(workdir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output[-4000:]
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(WORLD)]


def test_no_broadcast_of_fsdp_shards_at_a_fresh_start(ranks: list[dict[str, Any]]) -> None:
    """torch.distributed.broadcast refuses DTensors, so Megatron FSDP's broadcast_params raises
    with DP 2 (every restart of an FSDP job was a fresh start that crashed here); the trainer
    does not broadcast under FSDP, and still does with DDP."""
    for seen in ranks:
        b = seen["broadcast"]
        assert "c10d.broadcast_" in b["fsdp_broadcast_error"]
        assert b["fsdp_broadcast"] is False
        assert b["ddp_broadcast"] is True
        assert b["ddp_weight"] == 1.0  # rank 0's value on every rank


def test_recorded_buckets_are_rebuilt_through_ddps_own_rule(ranks: list[dict[str, Any]]) -> None:
    """The dp_reshardable optimizer state is stored per bucket. DDP rewrites the size it is
    given (None becomes max(40M, 1M·DP) with overlap; any size becomes one bucket without), so
    the trainer makes one bucket explicit with overlap, and turns overlap on for a recorded
    size: the resumed run has the saved buckets."""
    for seen in ranks:
        b = seen["buckets"]
        # One bucket saved without overlap (Megatron-LM's default), resumed on a GPU.
        assert b["one-bucket-gpu"] == {"buckets": 1, "recorded": None}
        assert b["one-bucket-gpu-as-is"]["recorded"] == 40_000_000  # was: 40M-parameter buckets
        # 5000-parameter buckets saved with overlap, resumed without (the CPU platform).
        # (four layers of 4,160 parameters: a bucket closes at the second layer past 5000)
        assert b["5000-saved"] == {"buckets": 2, "recorded": 5000}
        assert b["5000-cpu"] == b["5000-saved"]
        assert b["5000-cpu-as-is"] == {"buckets": 1, "recorded": None}  # was: one bucket
        assert b["overlap-sync"] > 0


def test_fsdp_dtensor_checkpoints_save_load_and_scan_on_gloo(ranks: list[dict[str, Any]]) -> None:
    """The fsdp_dtensor format as Megatron-LM writes it (plain torch DCP: no common.pt, no
    metadata.json), through the trainer's own save, load and scan: a complete one is found,
    read without loading a tensor (our record, args, iteration; the loss for pruning), loads
    back shard for shard, and an interrupted one is incomplete (the scan would have deleted
    every one of them as incomplete before: it required metadata.json and common.pt)."""
    for rank, seen in enumerate(ranks):
        d = seen["dcp"]
        assert d["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        assert d["format"] == "fsdp_dtensor"
        assert d["complete"] == [2, 4]
        assert d["common"] == {
            "iteration": 4,
            "trainer": 4,
            "args": {"ckpt_format": "fsdp_dtensor", "use_megatron_fsdp": True},
        }
        assert d["losses"]["2"] == 6.5 and d["losses"]["4"] != d["losses"]["4"]  # NaN
        assert d["model_equal"] and d["exp_avg_equal"]
        assert d["loaded_scheduler"] == {"num_steps": 32, "max_lr": 1e-3}
        assert d["loaded_iteration"] == 4
        if rank == 0:
            assert "an fsdp_dtensor checkpoint (Megatron FSDP): mjob export reads" in d["export"]
            assert "is truncated" in d["truncated"]
            assert d["no_metadata"] == ".metadata is missing (the save was interrupted)"
            assert d["after"] == [2]
