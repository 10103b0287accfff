"""Context parallelism splits every micro-batch's sequence per CP rank (issue 12, item 2).

CP needs Transformer Engine's attention, so it cannot train on CPU; the split itself is plain
tensor indexing, tested here against a hand-computed case and through MicroBatches.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_contract.config import load_config
from megatron_trainer.data import MicroBatches, MockDataset, split_for_context_parallel

from .trainer_configs import tiny_config, write_config

pytestmark = pytest.mark.trainer


def test_load_balanced_split_by_hand() -> None:
    # seq 8, CP=2: chunks of 2 tokens [0 1][2 3][4 5][6 7]; rank 0 keeps chunks 0 and 3,
    # rank 1 keeps chunks 1 and 2 (Megatron-Core's get_batch_on_this_cp_rank).
    tokens = torch.arange(16).view(2, 8)  # two sequences
    batch = {"tokens": tokens, "position_ids": torch.arange(8).repeat(2, 1)}
    rank0 = split_for_context_parallel(dict(batch), cp_size=2, cp_rank=0)
    rank1 = split_for_context_parallel(dict(batch), cp_size=2, cp_rank=1)
    assert rank0["tokens"].tolist() == [[0, 1, 6, 7], [8, 9, 14, 15]]
    assert rank1["tokens"].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    # Positions travel with their tokens (RoPE / learned positions stay correct).
    assert rank0["position_ids"].tolist() == [[0, 1, 6, 7], [0, 1, 6, 7]]
    assert rank1["position_ids"].tolist() == [[2, 3, 4, 5], [2, 3, 4, 5]]


def test_cp4_split_by_hand_and_every_token_counted_once() -> None:
    # seq 16, CP=4: 8 chunks of 2; rank r keeps chunks r and 7-r.
    mask = torch.ones(1, 16)
    tokens = torch.arange(16).view(1, 16)
    expected = {0: [0, 1, 14, 15], 1: [2, 3, 12, 13], 2: [4, 5, 10, 11], 3: [6, 7, 8, 9]}
    seen: list[int] = []
    counted = 0.0
    for rank in range(4):
        part = split_for_context_parallel({"tokens": tokens, "loss_mask": mask}, 4, rank)
        assert part["tokens"].tolist() == [expected[rank]]
        seen += part["tokens"].view(-1).tolist()
        counted += float(part["loss_mask"].sum())
    assert sorted(seen) == list(range(16))
    assert counted == 16.0  # the DP×CP all-reduce of token counts sees each token once


def test_cp1_is_untouched_and_bad_lengths_are_refused() -> None:
    batch = {"tokens": torch.arange(6).view(1, 6)}
    assert split_for_context_parallel(batch, 1, 0) is batch
    with pytest.raises(ValueError, match="not divisible by 2 × context parallel size"):
        split_for_context_parallel(batch, 2, 0)


def test_micro_batches_hand_out_this_cp_ranks_share(tmp_path: Path) -> None:
    cfg_json = tiny_config(tmp_path / "ckpt", trainIters=2)
    cfg = load_config(write_config(cfg_json, tmp_path / "c.json"))
    seq = cfg.model.seq_length
    dataset = MockDataset(cfg.model.vocab_size, seq, cfg.training.seed, 16)
    full = MicroBatches(dataset, cfg, 0, 0, torch.device("cpu")).next_step()
    shares = [
        MicroBatches(dataset, cfg, 0, 0, torch.device("cpu"), cp_size=2, cp_rank=r).next_step()
        for r in (0, 1)
    ]
    quarter = seq // 4
    for i, whole in enumerate(full):
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            rank0, rank1 = shares[0][i][key], shares[1][i][key]
            assert rank0.shape[1] == rank1.shape[1] == seq // 2
            chunks = whole[key].split(quarter, dim=1)
            assert torch.equal(rank0, torch.cat([chunks[0], chunks[3]], dim=1))
            assert torch.equal(rank1, torch.cat([chunks[1], chunks[2]], dim=1))
