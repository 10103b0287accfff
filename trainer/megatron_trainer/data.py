"""Training data: a mock dataset, or GPTDataset blends over .bin/.idx, read at a resumable position.

Sample `i` of the training stream is a pure function of (config, i), and global batch `g` is
samples [g·GBS, (g+1)·GBS). So the whole data position is one number, `consumed_samples`, which the
checkpoint stores: a resumed run reads exactly the samples the lost run would have read next.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from megatron_contract.config import TrainerConfig
from megatron_contract.errors import ConfigError

from .tokenizer import DatasetTokenizer, TokenizerError

MOCK_NOISE = 0.05  # share of tokens replaced by random ones, so the loss does not reach zero
MOCK_MAX_STRIDE = 4  # gpt-tiny goes from ln(1024) ≈ 6.9 to ≈ 5.2 in 60 steps (16 gave only 6.4)


class MockDataset(Dataset[dict[str, np.ndarray]]):
    """Noisy arithmetic progressions modulo the vocabulary: synthetic, but learnable.

    A model that sees a few tokens can infer the stride, so the loss visibly falls, which is what
    a demo or a smoke test of the optimizer needs (uniform random tokens would stay at ln V).
    """

    def __init__(self, vocab_size: int, seq_length: int, seed: int, num_samples: int) -> None:
        self.vocab_size = vocab_size
        self.seq_length = seq_length
        self.seed = seed
        self.num_samples = num_samples
        self._positions = np.arange(seq_length + 1, dtype=np.int64)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, index])
        start = rng.integers(self.vocab_size)
        stride = rng.integers(1, MOCK_MAX_STRIDE + 1)
        seq = (start + stride * self._positions) % self.vocab_size
        noisy = np.asarray(rng.random(seq.shape[0]) < MOCK_NOISE)
        seq[noisy] = rng.integers(self.vocab_size, size=int(np.count_nonzero(noisy)))
        return {
            "tokens": seq[:-1],
            "labels": seq[1:],
            "loss_mask": np.ones(self.seq_length, dtype=np.float32),
            "position_ids": self._positions[:-1],
        }


def build_dataset(cfg: TrainerConfig, num_samples: int) -> Dataset[Any]:
    """The training split. Collective when real data is used (rank 0 builds index caches first)."""
    m = cfg.model
    if cfg.data.mock:
        return MockDataset(m.vocab_size, m.seq_length, cfg.training.seed, num_samples)
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    assert cfg.data.blend and cfg.data.tokenizer_path  # validate() guarantees both
    try:
        tokenizer = DatasetTokenizer(cfg.data.tokenizer_path)
    except TokenizerError as err:
        raise ConfigError([f"data.tokenizer.path: {err}"]) from err
    if tokenizer.vocab_size > m.padded_vocab_size:
        raise ConfigError(
            [
                f"data.tokenizer.path: the tokenizer has {tokenizer.vocab_size} tokens but "
                f"model.paddedVocabSize is {m.padded_vocab_size}; set model.vocabSize to at "
                "least the tokenizer's size"
            ]
        )
    prefixes = [entry.prefix for entry in cfg.data.blend]
    weights = [entry.weight for entry in cfg.data.blend]
    cache = IndexCache(cfg, num_samples)
    dataset_config = GPTDatasetConfig(
        random_seed=cfg.training.seed,
        sequence_length=m.seq_length,
        blend=(prefixes, weights if len(prefixes) > 1 else None),
        split=cfg.data.split,
        # Index caches go to the (writable, shared) checkpoint volume: the data volume may be
        # read-only, and a restarted job reuses them instead of rebuilding.
        path_to_cache=str(cache.path),
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [num_samples, 0, 0], lambda: True, dataset_config
    ).build()
    cache.commit()
    if train is None:
        raise ConfigError([f"data.split: {cfg.data.split!r} leaves no training documents"])
    return train  # type: ignore[no-any-return]


class IndexCache:
    """Megatron's dataset index caches, made safe against a kill while they are written.

    Megatron writes its .npy index files in place and trusts any that exist, so a kill during the
    first build would leave a truncated file that fails every restart. We let it write into
    `<fingerprint>.partial` and rename that to `<fingerprint>` (with a `.complete` marker) only
    after every rank has built from it. Collective: every rank constructs and commits.
    """

    def __init__(self, cfg: TrainerConfig, num_samples: int) -> None:
        key = {
            "blend": [(e.prefix, e.weight) for e in cfg.data.blend or ()],
            "tokenizer": cfg.data.tokenizer_path,
            "split": cfg.data.split,
            "seqLength": cfg.model.seq_length,
            "seed": cfg.training.seed,
            "samples": num_samples,
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        root = Path(cfg.checkpoint.dir) / "data-cache"
        self.final, self.partial = root / digest, root / f"{digest}.partial"
        self.rank = torch.distributed.get_rank()
        if self.rank == 0 and not (self.final / ".complete").exists():
            shutil.rmtree(self.partial, ignore_errors=True)  # from a build that was killed
        torch.distributed.barrier()
        self.ready = (self.final / ".complete").exists()
        self.path = self.final if self.ready else self.partial

    def commit(self) -> None:
        torch.distributed.barrier()  # every rank has read the indices it needs
        if self.rank == 0 and not self.ready:
            (self.partial / ".complete").touch()
            shutil.rmtree(self.final, ignore_errors=True)
            os.replace(self.partial, self.final)
        torch.distributed.barrier()


class DataParallelBatchSampler(Sampler[list[int]]):
    """Megatron's pretraining order: micro-batch m of DP rank d in the global batch starting at
    sample c holds samples c + m·MBS·DP + d·MBS + [0, MBS)."""

    def __init__(
        self, start: int, total: int, micro_batch_size: int, dp_rank: int, dp_size: int
    ) -> None:
        self.start, self.total = start, total
        self.micro_batch_size, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __iter__(self) -> Iterator[list[int]]:
        stride = self.micro_batch_size * self.dp_size
        first = self.start
        while first + stride <= self.total:
            lo = first + self.dp_rank * self.micro_batch_size
            yield list(range(lo, lo + self.micro_batch_size))
            first += stride

    def __len__(self) -> int:
        return max(0, (self.total - self.start) // (self.micro_batch_size * self.dp_size))


class MicroBatches:
    """Hands out each step's micro-batches for this DP rank, from `consumed_samples` on, each cut
    to this context-parallel rank's share of the sequence."""

    def __init__(
        self,
        dataset: Dataset[Any],
        cfg: TrainerConfig,
        consumed_samples: int,
        dp_rank: int,
        device: torch.device,
        cp_size: int = 1,
        cp_rank: int = 0,
    ) -> None:
        t = cfg.training
        total = t.train_iters * t.global_batch_size
        sampler = DataParallelBatchSampler(
            consumed_samples, total, t.micro_batch_size, dp_rank, cfg.parallelism.data
        )
        self.loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=cfg.data.num_workers,
            pin_memory=device.type == "cuda",
        )
        self.iterator = iter(self.loader)
        self.num_microbatches = t.num_microbatches
        self.device = device
        self.cp_size, self.cp_rank = cp_size, cp_rank

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        batches = []
        for _ in range(self.num_microbatches):
            batch = next(self.iterator)
            on_device = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            batches.append(split_for_context_parallel(on_device, self.cp_size, self.cp_rank))
        return batches


def split_for_context_parallel(
    batch: dict[str, torch.Tensor], cp_size: int, cp_rank: int
) -> dict[str, torch.Tensor]:
    """This CP rank's part of every [batch, seq] tensor: Megatron-Core's load-balanced split.

    The sequence is cut into 2·cp chunks and rank r keeps chunks r and 2·cp−1−r, so with causal
    attention every rank gets the same amount of work (megatron/core/utils.py
    `get_batch_on_this_cp_rank`, which Megatron-LM applies to tokens, labels, loss mask and
    positions; TE's context-parallel attention and RoPE expect exactly this order). Each token
    lands on one CP rank, so summing token counts over the DP×CP group counts each token once.
    """
    if cp_size == 1:
        return batch
    chunks = 2 * cp_size
    index = torch.tensor([cp_rank, chunks - 1 - cp_rank])
    out = {}
    for key, value in batch.items():
        seq = value.shape[1]
        if seq % chunks:
            raise ValueError(
                f"{key}: sequence length {seq} is not divisible by 2 × context parallel size"
            )
        split = value.view(value.shape[0], chunks, seq // chunks, *value.shape[2:])
        kept = split.index_select(1, index.to(value.device))
        out[key] = kept.reshape(value.shape[0], -1, *value.shape[2:])
    return out
