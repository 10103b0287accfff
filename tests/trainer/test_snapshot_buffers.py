"""The snapshot's host buffers (megatron_trainer/snapshots.py): a snapshot is copied into one kept
buffer at fixed offsets, sent to its peer as that buffer, and the peer's copy is read back as
views of the bytes received. The end-to-end checks (bit-identical resumes from the Memory and
Peer tiers) are tests/local/test_local_ladder.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from megatron_trainer.snapshots import ALIGN, Staging, _flatten, _layout, _view

pytestmark = pytest.mark.trainer


@dataclass
class Shard:
    """What Staging reads and writes of a ShardedTensor."""

    data: torch.Tensor


@dataclass
class StateDict:
    """What Staging reads of an MCoreTensorAwareStateDict."""

    _sharded_tensors: list[Shard]


def _tensors() -> list[torch.Tensor]:
    """Mixed dtypes and sizes, a non-contiguous one, an empty one, and one that needs grad."""
    weight = torch.randn(5, 7, requires_grad=True)
    return [
        weight,
        torch.arange(9, dtype=torch.int64),
        torch.randn(4, 6).t(),  # non-contiguous
        torch.randn(3).to(torch.bfloat16),
        torch.tensor([True, False, True]),
        torch.empty(0, 4),
        torch.randn(1),
    ]


def test_every_tensor_starts_aligned_and_the_layout_counts_every_byte() -> None:
    tensors = _tensors()
    offsets, total = _layout([(t.dtype, t.shape) for t in tensors])
    assert offsets[0] == 0 and all(o % ALIGN == 0 for o in offsets)
    ends = [o + t.numel() * t.element_size() for o, t in zip(offsets, tensors, strict=True)]
    assert all(end <= nxt for end, nxt in zip(ends, offsets[1:], strict=False))
    assert ends[-1] <= total < ends[-1] + ALIGN


def test_staging_copies_into_one_kept_buffer_that_training_cannot_change() -> None:
    tensors = _tensors()
    sources = [t.detach().clone() for t in tensors]
    shards = StateDict([Shard(t) for t in tensors])
    staging = Staging(pin=False)
    staged = staging.stage(shards)
    assert staged == sum(t.numel() * t.element_size() for t in tensors)
    copies = [sh.data for sh in shards._sharded_tensors]
    for copy, source in zip(copies, sources, strict=True):
        assert copy.dtype == source.dtype and copy.shape == source.shape
        assert torch.equal(copy, source) and not copy.requires_grad
    # Training changes its tensors in place: the snapshot keeps the values it was taken with.
    with torch.no_grad():
        tensors[0].add_(1.0)
        tensors[1].mul_(3)
    assert torch.equal(copies[0], sources[0]) and torch.equal(copies[1], sources[1])
    # The copy sent to the peer is the buffer itself, not a new one.
    flat = _flatten(copies)
    assert flat.data_ptr() == staging.buffer.data_ptr()  # type: ignore[union-attr]
    # The next snapshot reuses the buffer (no new pages) and has the new values.
    again = StateDict([Shard(t) for t in tensors])
    staging.stage(again)
    assert again._sharded_tensors[0].data.data_ptr() == copies[0].data_ptr()
    assert torch.equal(again._sharded_tensors[0].data, tensors[0].detach())


def test_a_peer_reads_the_same_tensors_back_from_the_bytes_it_received() -> None:
    tensors = _tensors()
    shards = StateDict([Shard(t) for t in tensors])
    Staging(pin=False).stage(shards)
    sent = _flatten([sh.data for sh in shards._sharded_tensors])
    received = torch.empty(sent.numel() + 3 * ALIGN, dtype=torch.uint8)  # a kept, larger buffer
    received[: sent.numel()].copy_(sent)
    # The receiver knows only each tensor's dtype and shape (the hollow state dict's metadata).
    metadata: list[tuple[torch.dtype, Any]] = [(t.dtype, t.shape) for t in tensors]
    offsets, total = _layout(metadata)
    assert total == sent.numel()
    for (dtype, shape), offset, original in zip(metadata, offsets, tensors, strict=True):
        assert torch.equal(_view(received, offset, dtype, shape), original.detach())


def test_tensors_that_are_not_one_buffers_views_are_copied_into_one() -> None:
    tensors = _tensors()
    flat = _flatten(tensors)
    offsets, total = _layout([(t.dtype, t.shape) for t in tensors])
    assert flat.numel() == total
    assert all(flat.data_ptr() != t.data_ptr() for t in tensors)
    for tensor, offset in zip(tensors, offsets, strict=True):
        assert torch.equal(_view(flat, offset, tensor.dtype, tensor.shape), tensor.detach())
    assert _flatten([]).numel() == 0
