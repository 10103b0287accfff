"""Megatron FSDP with data parallelism 2 on CPU (gloo), as far as it runs without CUDA: two rank
processes (fsdp_ranks.py) hold parameters as DTensor shards, as Megatron FSDP holds them once it
has wrapped a model, and run the trainer's own start-up and checkpoint code on them. Megatron FSDP
itself needs CUDA streams (test_fsdp_config.py); its training runs in test_gpu.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.ports import free_port

pytestmark = pytest.mark.trainer

RANKS = Path(__file__).with_name("fsdp_ranks.py")
WORLD = 2


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every check of fsdp_ranks.py, run once on two ranks; what each rank saw."""
    workdir = tmp_path_factory.mktemp("fsdp-ranks")
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
