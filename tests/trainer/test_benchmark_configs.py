"""The GPU benchmarks' trainer configs parse as the trainer parses them.

They run only where a GPU is lent, so nothing else notices when the config contract grows a field:
both rotted once and the first GPU run refused them ("checkpoint.memory: required field is
missing"). Parsing is all this checks; the scripts' --smoke and CPU modes train for real.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import memory_tiers, trainer_throughput
from megatron_contract.config import ConfigError, parse_config

pytestmark = pytest.mark.trainer

# The throughput script's own defaults (its argparse).
ARGS = argparse.Namespace(iters=40, warmup=10, save_interval=15, global_batch_size=16,
                          micro_batch_size=1, recompute="none")  # fmt: skip


@pytest.mark.parametrize("smoke", [False, True], ids=["gpu", "smoke"])
def test_the_throughput_benchmark_writes_a_config_the_trainer_accepts(
    tmp_path: Path, smoke: bool
) -> None:
    cfg = parse_config(trainer_throughput.resolved_config(ARGS, tmp_path / "ckpt", smoke))
    assert cfg.model.num_layers == (4 if smoke else 24)
    assert cfg.platform == ("cpu" if smoke else "cuda")


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_the_memory_tiers_benchmark_writes_a_config_the_trainer_accepts(
    tmp_path: Path, gpu: bool
) -> None:
    cfg = parse_config(memory_tiers.config(tmp_path, 10, gpu, tmp_path / "durable"))
    assert cfg.checkpoint.memory is not None
    assert cfg.platform == ("cuda" if gpu else "cpu")


def test_a_missing_field_is_refused() -> None:
    """The check above can fail: the contract refuses a config without a required section."""
    data = trainer_throughput.resolved_config(ARGS, Path("/tmp/x"), smoke=False)
    del data["checkpoint"]["memory"]
    with pytest.raises(ConfigError, match=r"checkpoint\.memory"):
        parse_config(data)
