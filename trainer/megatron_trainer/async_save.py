"""The asynchronous checkpoint writer: Megatron-Core's persistent worker, on the rank's own GPU.

Megatron-LM 0.16.1 only runs async saves with its persistent worker (arguments.py disables
--async-save without --use-persistent-ckpt-worker: the fork-per-save caller can write pinned host
buffers that were already freed). Two things differ from Megatron-Core's `PersistentAsyncCaller`:

- Its worker process selects `torch.cuda.set_device(global_rank % device_count())`, which is
  another rank's GPU whenever a pod sees more GPUs than it runs ranks (procsPerNode below the
  visible GPUs). Ours passes LOCAL_RANK, the GPU this rank trains on (platform/cuda.setup).
- On the CPU platform the worker installs the same CUDA-to-CPU patches as the rank (it is a
  spawned process: nothing of the rank's patches is inherited), so CPU runs use the very code
  path GPU runs do.

The worker is a non-daemon process waiting in `queue.get()`; multiprocessing's exit handler joins
it, so a rank that leaves on an error must kill it first (`abort_all`, `Checkpointer.abort`), as
Megatron-LM does with `close(abort=True)`.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from megatron.core.dist_checkpointing.strategies import async_utils
from megatron.core.dist_checkpointing.strategies.async_utils import (
    AsyncCallsQueue,
    PersistentAsyncCaller,
)
from torch import multiprocessing as mp

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[AsyncCallsQueue] = weakref.WeakSet()


def worker_main(local_rank: int, is_cuda: bool, *queues_and_level: Any) -> None:
    """The writer process: Megatron-Core's own loop, on this rank's device."""
    if not is_cuda:
        from .platform import cpu

        cpu.install()
        mp.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    # async_loop calls torch.cuda.set_device(rank % device_count()) with the rank it is given.
    PersistentAsyncCaller.async_loop(local_rank, *queues_and_level)


class LocalRankCaller(PersistentAsyncCaller):  # type: ignore[misc]
    """PersistentAsyncCaller whose worker runs `worker_main` for this rank's LOCAL_RANK."""

    def __init__(self, local_rank: int, is_cuda: bool) -> None:
        super().__init__()
        self.local_rank, self.is_cuda = local_rank, is_cuda

    def schedule_async_call(self, async_req: Any) -> None:
        if async_req.async_fn is not None and self.process is None:  # type: ignore[has-type]
            # Started here, so the base class finds a process and only queues the request.
            process = mp.get_context("spawn").Process(
                target=worker_main,
                args=(
                    self.local_rank,
                    self.is_cuda,
                    self.queue,
                    self.preload_q,
                    self.comp_q,
                    async_utils.logger.getEffectiveLevel(),
                ),
            )
            process.start()
            self.process = process
        super().schedule_async_call(async_req)

    def close(self, abort: bool = False) -> None:
        # Megatron-Core's close logs the global rank first, which raises once the process group
        # is gone (as when the garbage collector closes an already closed caller at exit).
        if self.process is not None:
            super().close(abort=abort)


class WriterQueue(AsyncCallsQueue):  # type: ignore[misc]
    """AsyncCallsQueue with one persistent LocalRankCaller."""

    def __init__(self, local_rank: int, is_cuda: bool) -> None:
        super().__init__(persistent=True)
        self.persistent_caller = LocalRankCaller(local_rank, is_cuda)
        _LIVE.add(self)


def writer_queue(local_rank: int, is_cuda: bool) -> AsyncCallsQueue:
    if not is_cuda:
        # On CPU the state dict's tensors themselves travel to the writer. torch's default
        # ("file_descriptor") hands each storage over through a connection to this process's
        # resource sharer, which was refused under load with several ranks per machine;
        # "file_system" passes shared-memory names instead. (On CUDA the tensors travel as CUDA
        # IPC handles and the writer copies them to the host itself.)
        mp.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]
    return WriterQueue(local_rank, is_cuda)


def abort(queue: AsyncCallsQueue) -> None:
    """Kill the queue's writer now, without the collective finalisation (an error path: the
    other ranks may never get there). A save in flight stays incomplete, and resume skips it."""
    caller = queue.persistent_caller
    if caller is not None and caller.process is not None:
        log.warning("killing the async checkpoint writer (the rank is exiting on an error)")
        caller.close(abort=True)
    queue.async_calls.clear()


def abort_all() -> None:
    """`abort` every writer of this process (the worker's last resort on an error exit)."""
    for queue in list(_LIVE):
        abort(queue)
