"""TensorBoard scalars (rank 0) and the optional torch.profiler window, on the checkpoint volume."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from megatron_contract.config import ProfilingConfig

log = logging.getLogger(__name__)


class Scalars:
    """TensorBoard event files under <checkpoint dir>/tensorboard, written by rank 0 only."""

    def __init__(self, log_dir: str | None) -> None:
        self.writer: Any = None
        if log_dir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is in the trainer extra; say so once and go on
            log.warning("tensorboard is not installed: no TensorBoard scalars")
            return
        os.makedirs(log_dir, exist_ok=True)
        self.writer = SummaryWriter(log_dir=log_dir)

    def add(self, iteration: int, values: dict[str, float | None]) -> None:
        if self.writer is None:
            return
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, value, iteration)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ProfilerWindow:
    """Profiles iterations [startStep, endStep] on the chosen ranks; a Chrome trace per rank."""

    def __init__(self, cfg: ProfilingConfig | None, rank: int, out_dir: str, cuda: bool) -> None:
        self.cfg = cfg if cfg is not None and rank in cfg.ranks else None
        self.rank = rank
        self.out_dir = out_dir
        self.cuda = cuda
        self.profiler: Any = None

    def before_step(self, iteration: int) -> None:
        if self.cfg is None or iteration != self.cfg.start_step or self.profiler is not None:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self.profiler.__enter__()

    def after_step(self, iteration: int) -> None:
        if self.profiler is None or self.cfg is None or iteration < self.cfg.end_step:
            return
        self.stop(iteration)

    def stop(self, iteration: int) -> None:
        if self.profiler is None or self.cfg is None:
            return
        self.profiler.__exit__(None, None, None)
        os.makedirs(self.out_dir, exist_ok=True)
        path = os.path.join(
            self.out_dir, f"rank{self.rank}-iter{self.cfg.start_step}-{iteration}.json"
        )
        self.profiler.export_chrome_trace(path)
        log.info("profiler trace written to %s", path)
        self.profiler = None
