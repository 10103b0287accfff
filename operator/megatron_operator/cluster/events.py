"""Events on a job: aggregated and rate-limited, as client-go's event recorder does.

A job that fails and restarts in a loop, or a tenant that toggles its spec, would otherwise
make the operator post an Event object per occurrence: etcd writes and `kubectl describe`
noise without end. So, per job:

- an event equal to one posted in the last `AGGREGATE_SECONDS` (same type, reason and
  message) is not posted again: the posted one's `count` and `lastTimestamp` are updated
  (client-go's EventCorrelator does the same with a patch);
- at most `BURST` posts, refilled at one per `REFILL_SECONDS` (client-go's spam filter: a burst
  of 25, then one every 5 minutes); past that, events are dropped and counted in
  `megatron_operator_events_dropped_total`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

AGGREGATE_SECONDS = 600.0
BURST = 25
REFILL_SECONDS = 300.0
MAX_REMEMBERED = 64  # distinct events remembered per job for aggregation

Key = tuple[str, str]


@dataclass
class _Seen:
    name: str  # the Event object's name, to update its count
    count: int
    at: float


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventLimiter:
    """Decides, per job, whether an event is posted, counted on an earlier one, or dropped."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.seen: dict[Key, dict[tuple[str, str, str], _Seen]] = {}
        self.buckets: dict[Key, _Bucket] = {}

    def decide(
        self, job: Key, type_: str, reason: str, message: str
    ) -> tuple[str, str | None, int]:
        """("post", None, 1), ("count", event name, new count) or ("drop", None, 0)."""
        now = self.clock()
        what = (type_, reason, message)
        with self.lock:
            seen = self.seen.setdefault(job, {})
            earlier = seen.get(what)
            if earlier is not None and now - earlier.at < AGGREGATE_SECONDS:
                earlier.count += 1
                earlier.at = now
                return "count", earlier.name, earlier.count
            bucket = self.buckets.setdefault(job, _Bucket(float(BURST), now))
            bucket.tokens = min(float(BURST), bucket.tokens + (now - bucket.at) / REFILL_SECONDS)
            bucket.at = now
            if bucket.tokens < 1.0:
                return "drop", None, 0
            bucket.tokens -= 1.0
            return "post", None, 1

    def posted(self, job: Key, type_: str, reason: str, message: str, name: str) -> None:
        """Remember the Event object just created, so repeats update it."""
        with self.lock:
            seen = self.seen.setdefault(job, {})
            seen[(type_, reason, message)] = _Seen(name, 1, self.clock())
            if len(seen) > MAX_REMEMBERED:
                oldest = min(seen, key=lambda k: seen[k].at)
                del seen[oldest]

    def forget(self, job: Key) -> None:
        with self.lock:
            self.seen.pop(job, None)
            self.buckets.pop(job, None)
