"""Pod creates and deletes: in slow-start batches per job, and fair across jobs.

- **Slow start**, as Kubernetes' Job controller creates pods (`slowStartBatch`): a job's calls go
  out in batches of 1, 2, 4, 8, ..., each after the previous one succeeded; the first failure
  stops the rest. A gang the apiserver refuses (a quota, an admission policy, a bad spec) costs
  one call, not 4,096.
- **Fairness**: the calls of every job share one pool of worker threads that take them round
  robin, one job at a time, so a 4,096-pod restart is interleaved with another tenant's 8 pods
  instead of running ahead of them (a shared FIFO pool made every other job wait for it).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
Key = tuple[str, str]
SLOW_START_INITIAL = 1


class FairPool:
    """Worker threads that run queued calls round robin across keys (jobs)."""

    def __init__(self, workers: int, name: str = "gang") -> None:
        self.cond = threading.Condition()
        self.queues: dict[Key, deque[tuple[Callable[[], Any], Future[Any]]]] = {}
        self.ring: deque[Key] = deque()  # keys with queued calls, in turn order
        self.stopping = False
        self.threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self.threads:
            t.start()

    def map(self, key: Key, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Run fn on every item in the pool, under `key`'s turn; wait for all of them. Raises
        the first exception (in item order) once every call has finished."""
        futures: list[Future[R]] = []
        with self.cond:
            if self.stopping:
                raise RuntimeError("the pod-call pool is shut down")
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = deque()
                self.ring.append(key)
            for item in items:
                future: Future[R] = Future()
                queue.append((_bind(fn, item), future))
                futures.append(future)
            self.cond.notify(len(items))
        return [f.result() for f in _settled(futures)]

    def shutdown(self) -> None:
        with self.cond:
            self.stopping = True
            for queue in self.queues.values():
                for _, future in queue:
                    future.cancel()
            self.queues.clear()
            self.ring.clear()
            self.cond.notify_all()

    def _next(self) -> tuple[Callable[[], Any], Future[Any]] | None:
        with self.cond:
            while not self.ring and not self.stopping:
                self.cond.wait()
            if self.stopping:
                return None
            key = self.ring.popleft()
            queue = self.queues[key]
            call = queue.popleft()
            if queue:
                self.ring.append(key)  # its next call waits for every other job's turn
            else:
                del self.queues[key]
            return call

    def _work(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)


def slow_start(pool: FairPool, key: Key, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """fn on every item, in batches of 1, 2, 4, ... (each waits for the one before); the first
    failure is raised once its batch has finished, and the items after it are not tried."""
    results: list[R] = []
    batch, done = SLOW_START_INITIAL, 0
    while done < len(items):
        chunk = items[done : done + batch]
        results += pool.map(key, fn, chunk)
        done += len(chunk)
        batch *= 2
    return results


def _bind(fn: Callable[[T], R], item: T) -> Callable[[], R]:
    return lambda: fn(item)


def _settled(futures: list[Future[R]]) -> list[Future[R]]:
    """Wait for every future, so a failure never leaves calls of the batch running behind."""
    for f in futures:
        f.exception()
    return futures
