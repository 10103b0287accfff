"""Per-job rate limits on what a trainer's writes cost the operator and the apiserver.

A trainer pod may write its progress Lease as often as it likes (the 10 s interval is only a
courtesy of our own trainer). Each write is a watch event, and copying a record into the job's
status is a full-object status write: a 449 KB job cost 8.7 ms of operator CPU and an etcd
revision of that size per write. Like the Job controller, which batches its status updates,
the operator therefore:

- copies progress into the status at most once per `PROGRESS_COPY_SECONDS` per job
  (`ProgressLimiter`; the state machine holds the newer record until then, see
  `World.progress_not_before`);
- wakes a job for its Lease's events at most once per `LEASE_WAKE_SECONDS`
  (`WakeThrottle`): a burst of writes in between becomes one wake at the end of the window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from megatron_contract.paths import PROGRESS_MIN_INTERVAL_SECONDS

PROGRESS_COPY_SECONDS: float = PROGRESS_MIN_INTERVAL_SECONDS
LEASE_WAKE_SECONDS: float = PROGRESS_MIN_INTERVAL_SECONDS / 2

Key = tuple[str, str]


class ProgressLimiter:
    """When each job last had progress copied into its status (this process's memory: after a
    restart the first copy is free, which costs one write)."""

    def __init__(self, interval: float = PROGRESS_COPY_SECONDS) -> None:
        self.interval = timedelta(seconds=interval)
        self.lock = threading.Lock()
        self.last: dict[Key, datetime] = {}

    def not_before(self, key: Key) -> datetime | None:
        with self.lock:
            last = self.last.get(key)
        return last + self.interval if last is not None else None

    def copied(self, key: Key, now: datetime) -> None:
        with self.lock:
            self.last[key] = now

    def forget(self, key: Key) -> None:
        with self.lock:
            self.last.pop(key, None)


class WakeThrottle:
    """At most one wake per `interval` per job; events inside the window become one wake at
    its end. Used from the asyncio loop only (no lock)."""

    def __init__(
        self, interval: float = LEASE_WAKE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.last: dict[Key, float] = {}  # when the job was last woken for these events
        self.pending: set[Key] = set()  # a wake is scheduled for the window's end

    def admit(self, key: Key) -> float | None:
        """0: wake now; a delay: schedule one wake that far ahead (then call `fired`); None:
        one is already scheduled."""
        if key in self.pending:
            return None
        now = self.clock()
        last = self.last.get(key)
        if last is None or now - last >= self.interval:
            self.last[key] = now
            return 0.0
        self.pending.add(key)
        return last + self.interval - now

    def fired(self, key: Key) -> None:
        self.pending.discard(key)
        self.last[key] = self.clock()

    def forget(self, key: Key) -> None:
        self.last.pop(key, None)
        self.pending.discard(key)
