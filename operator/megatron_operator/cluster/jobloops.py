"""The reconcile loop of each job that has work to do: one asyncio task per job, holding only
the job's key, its uid and a wake-up Event, never the job's body.

Why not a kopf daemon: kopf keeps the whole body of every object with a daemon for as long as
the daemon lives (its "live fresh body"), so memory grew with the size of the jobs (about 680
jobs of 1.5 MB filled a 1 GiB limit), and a finished job kept its daemon and its 60 s resync
for life. Here a loop holds a few hundred bytes, reads the job fresh at each reconcile, and ends
when the job is gone or has nothing left to do (finished or suspended, its pods stopped, no
deadline): `Controller.reconcile_job` then returns infinity. A change of the job's spec (a new
generation) or its deletion starts or wakes its loop again (handlers.job_changed).

The controller is level-triggered. Events for the job, its pods, its Lease and the nodes
coalesce into one wake-up, and the loop sleeps until the next deadline (a backoff, a hang
timeout, a TTL) or the next wake, like a work queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

DEBOUNCE_SECONDS = 0.05  # let a burst of pod events land before observing
Key = tuple[str, str]
# One reconcile of (namespace, name, uid) in the reconcile pool: seconds until the next one is
# due, or infinity when the job is gone or idle.
Step = Callable[[str, str, str | None], Awaitable[float]]


@dataclass
class _Loop:
    uid: str | None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class JobLoops:
    """The loops, keyed by (namespace, name). Used from the asyncio loop only."""

    def __init__(self, step: Step, debounce: float = DEBOUNCE_SECONDS) -> None:
        self.step = step
        self.debounce = debounce
        self.loops: dict[Key, _Loop] = {}

    def __contains__(self, key: Key) -> bool:
        return key in self.loops

    def __len__(self) -> int:
        return len(self.loops)

    def ensure(self, namespace: str, name: str, uid: str | None) -> None:
        """Start the job's loop, or wake the one already running for this uid. A loop of an
        older job of the same name (deleted and re-created) ends by itself: its reconcile sees
        another uid."""
        key = (namespace, name)
        loop = self.loops.get(key)
        if loop is not None and loop.uid == uid:
            loop.wake.set()
            return
        loop = _Loop(uid)
        self.loops[key] = loop
        loop.task = asyncio.get_running_loop().create_task(
            self._run(key, loop), name=f"job {namespace}/{name}"
        )

    def wake(self, namespace: str, name: str) -> None:
        loop = self.loops.get((namespace, name))
        if loop is not None:
            loop.wake.set()

    def wake_all(self) -> None:
        for loop in self.loops.values():
            loop.wake.set()

    def gone(self, namespace: str, name: str, uid: str | None) -> None:
        """The job was deleted: its loop (if of this uid) ends at its next wake."""
        loop = self.loops.get((namespace, name))
        if loop is not None and (uid is None or loop.uid == uid):
            del self.loops[(namespace, name)]
            if loop.task is not None:
                loop.task.cancel()

    async def stop(self) -> None:
        tasks = [loop.task for loop in self.loops.values() if loop.task is not None]
        self.loops.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, key: Key, loop: _Loop) -> None:
        namespace, name = key
        try:
            while self.loops.get(key) is loop:
                loop.wake.clear()
                try:
                    delay = await self.step(namespace, name, loop.uid)
                except Exception:  # never let one bad reconcile kill the loop; retry soon
                    log.exception("reconcile of %s/%s failed; retrying", namespace, name)
                    delay = 5.0
                if math.isinf(delay):
                    return  # gone, or nothing to do until the job changes
                if await _sleep(loop.wake, max(delay, 0.05)):
                    await asyncio.sleep(self.debounce)
        finally:
            if self.loops.get(key) is loop:
                del self.loops[key]


async def _sleep(wake: asyncio.Event, seconds: float) -> bool:
    """Sleep until woken (True) or timed out (False)."""
    try:
        await asyncio.wait_for(wake.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
