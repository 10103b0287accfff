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

The worker is forked when the rank starts (`prefork`, before the rank touches a device or
starts a thread), not spawned at the first save: a spawned worker imports torch and
Megatron-Core before it takes its first request (seconds of CPU), and the rank waits for that
import at its first save (Megatron-Core's caller blocks until the worker has staged the state
dict). A fork has all of it already. Megatron-Core spawns because it starts the worker late,
after CUDA is up, when a fork would be unsafe; this one is forked before CUDA exists here. The
same goes for Megatron-Core's write-results queue, a Manager process whose server unpickles the
write results (it imported torch to do so when spawned at the first save, sync saves too).
Both name themselves (`mt-save-writer`, `mt-save-manager`), not after their rank.
"""

from __future__ import annotations

import ctypes
import logging
import signal
import weakref
from multiprocessing.managers import SyncManager
from typing import Any

from megatron.core.dist_checkpointing.strategies import async_utils, filesystem_async
from megatron.core.dist_checkpointing.strategies.async_utils import (
    AsyncCallsQueue,
    PersistentAsyncCaller,
)
from torch import multiprocessing as mp

from .forksafe import fork_unsafe

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet[AsyncCallsQueue] = weakref.WeakSet()


def worker_main(local_rank: int, is_cuda: bool, *queues_and_level: Any) -> None:
    """The writer process: Megatron-Core's own loop, on this rank's device."""
    # A forked worker has the rank's handlers (a SIGTERM would set the rank's stop flag here):
    # it ends when told to, or when killed, as a spawned one does.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    _name(SAVE_WRITER_COMM)
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


_PREFORKED: list[WriterQueue] = []


def prefork(local_rank: int, is_cuda: bool, writer: bool) -> None:
    """Fork this rank's checkpoint helpers now, while a fork is safe (see the module's
    docstring): Megatron-Core's write-results queue (a Manager process, which unpickles the
    write results and so imported torch when spawned at the first save) and, for async saves,
    the writer, which `writer_queue` then hands out. Where a fork is unsafe (the imports started
    CUDA or a thread), nothing is forked and the first save spawns them, as Megatron-Core does."""
    reason = fork_unsafe()
    if reason:
        log.info("checkpoint helpers start at the first save (not forked now: %s)", reason)
        return
    ctx = mp.get_context("fork")
    if filesystem_async._results_queue is None:
        manager = SyncManager(ctx=ctx)
        manager.start(initializer=_name, initargs=(SAVE_MANAGER_COMM,))
        filesystem_async._results_queue = manager.Queue()  # the proxy keeps the manager
    if not writer:
        return
    queue = writer_queue(local_rank, is_cuda)
    caller = queue.persistent_caller
    caller.process = ctx.Process(
        target=worker_main,
        args=(
            local_rank,
            is_cuda,
            caller.queue,
            caller.preload_q,
            caller.comp_q,
            async_utils.logger.getEffectiveLevel(),
        ),
    )
    caller.process.start()
    _PREFORKED.append(queue)


SAVE_MANAGER_COMM = "mt-save-manager"
SAVE_WRITER_COMM = "mt-save-writer"


def _name(comm: str) -> None:
    """A forked helper's command name: not its rank's `mt-rank-N` (megatron_contract/procname.py),
    which tools read to find the rank."""
    ctypes.CDLL(None).prctl(15, comm.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def writer_queue(local_rank: int, is_cuda: bool) -> AsyncCallsQueue:
    if _PREFORKED:
        return _PREFORKED.pop()
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
