"""TensorBoard scalars (rank 0) and the optional torch.profiler window, on the checkpoint volume."""

from __future__ import annotations

import logging
import os
from typing import Any

from megatron_contract.config import ProfilingConfig

from . import profilers
from .profilers import Profiler
from .storage import LocalStorage, scratch_dir, storage_for

log = logging.getLogger(__name__)


class Scalars:
    """TensorBoard event files under <checkpoint dir>/tensorboard, written by rank 0 only.

    TensorBoard writes local files; with checkpoints on object storage they are written to local
    scratch and copied to <checkpoint URL>/tensorboard at each checkpoint and at the end."""

    def __init__(self, log_dir: str | None) -> None:
        self.writer: Any = None
        self.upload_to: str | None = None
        if log_dir is None:
            return
        if not isinstance(storage_for(log_dir), LocalStorage):
            self.upload_to, log_dir = log_dir, scratch_dir("tensorboard")
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
            self._upload()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self._upload()

    def _upload(self) -> None:
        if self.upload_to is None:
            return
        local = self.writer.log_dir
        store = storage_for(self.upload_to)
        for name in sorted(os.listdir(local)):
            store.upload(os.path.join(local, name), store.join(self.upload_to, name))


class ProfilerWindow:
    """Profiles iterations [startStep, endStep] on the chosen ranks with the configured plugin
    (`profilers`): one capture a rank in `out_dir` (<checkpoint dir>/profiles/<attempt>/).

    nsys wraps the whole process (the launcher starts it): here it only opens and closes the
    capture range. On object storage a capture is written to local scratch, then uploaded."""

    def __init__(self, cfg: ProfilingConfig | None, rank: int, out_dir: str, cuda: bool) -> None:
        self.cfg = cfg if cfg is not None and rank in cfg.ranks else None
        self.rank = rank
        self.out_dir = out_dir
        self.cuda = cuda
        self.profiler: Profiler | None = None
        self.started_at = 0

    def before_step(self, iteration: int) -> None:
        if self.cfg is None or iteration != self.cfg.start_step or self.profiler is not None:
            return
        self.profiler = profilers.load(self.cfg.tool, self.cuda)
        self.profiler.start()
        self.started_at = iteration
        log.info("profiler %s started at step %d on rank %d", self.cfg.tool, iteration, self.rank)

    def after_step(self, iteration: int) -> None:
        if self.profiler is None or self.cfg is None or iteration < self.cfg.end_step:
            return
        self.stop(iteration)

    def stop(self, iteration: int) -> None:
        if self.profiler is None or self.cfg is None:
            return
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        name = profilers.capture_name(self.rank, profiler.suffix)
        store = storage_for(self.out_dir)
        target = store.join(self.out_dir, name)
        if isinstance(store, LocalStorage):
            os.makedirs(self.out_dir, exist_ok=True)
            profiler.save(target)
        else:
            local = os.path.join(scratch_dir("profiles"), name)
            profiler.save(local)
            if os.path.exists(local):
                store.upload(local, target)
        log.info(
            "profiler %s: steps %d-%d of rank %d -> %s",
            self.cfg.tool,
            self.started_at,
            iteration,
            self.rank,
            target,
        )
