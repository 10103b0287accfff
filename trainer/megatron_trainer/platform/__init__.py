"""Where the ranks run: `cuda` (NCCL, one GPU per rank) or `cpu` (gloo, with Megatron-Core patches)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Platform:
    name: str  # "cpu" or "cuda"
    backend: str  # torch.distributed backend: "gloo" or "nccl"
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.name == "cuda"


def setup_platform(name: str, local_rank: int) -> Platform:
    """Prepare this process for `name` ("cpu" or "cuda"); call before building anything."""
    if name == "cpu":
        from . import cpu

        cpu.install()
        # The launcher sets OMP_NUM_THREADS to this rank's share of the cores; torch reads it at
        # import, but set it again in case the rank was started some other way.
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        if threads > 0:
            torch.set_num_threads(threads)
        return Platform("cpu", "gloo", torch.device("cpu"))
    from . import cuda

    return Platform("cuda", "nccl", cuda.setup(local_rank))
