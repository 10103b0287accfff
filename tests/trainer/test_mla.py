"""MLA without Transformer Engine builds and trains (issue 12, item 5).

Megatron-Core's MLA passes `k_channels` (the query/key head dim, no-RoPE plus RoPE part) and
`v_channels` (the value head dim) to its core attention. Without TE that is our SDPAttention,
which took neither, so the model failed at build. The value head dim here differs from the
query/key dim, as in DeepSeek-V2.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from .trainer_configs import tiny_config
from .trainer_runs import run_trainer

pytestmark = pytest.mark.trainer

MLA = {"qLoraRank": None, "kvLoraRank": 64, "qkHeadDim": 32, "qkPosEmbHeadDim": 16, "vHeadDim": 24}


def test_mla_trains_with_sdpa_and_a_different_value_head_dim(workdir: Path) -> None:
    cfg = tiny_config(workdir / "ckpt", trainIters=3, save_interval=100)
    cfg["model"]["mla"] = MLA
    run = run_trainer(cfg, workdir)
    assert run.returncode == 0, run.output[-4000:]
    assert "local dense layer spec, torch scaled_dot_product_attention" in run.output
    assert "MLA" in run.output
    losses = run.losses()
    assert sorted(losses) == [1, 2, 3]
    assert all(math.isfinite(v) and 6.0 < v < 7.5 for v in losses.values()), losses
