"""Exponential backoff with jitter and a cap, for retrying API calls that failed.

Pure: the random draw is passed in, so the schedule is testable. Jitter spreads the retries of
many jobs that failed at the same moment (an apiserver restart) instead of having them all come
back in the same second.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base: float = 1.0  # the first retry's delay
    factor: float = 2.0
    cap: float = 300.0  # never wait longer than this
    jitter: float = 0.5  # the delay is scaled by a factor drawn from [1 - jitter, 1]

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap) or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self}")

    def delay(self, failures: int, draw: float, at_least: float = 0.0) -> float:
        """The wait after `failures` consecutive failures (1 for the first); `draw` is uniform
        in [0, 1). `at_least` is a server's Retry-After, honoured up to the cap."""
        steps = max(failures, 1) - 1
        # Grow in a loop rather than with `factor ** steps`, which overflows for a long outage.
        raw = self.base
        for _ in range(steps):
            raw *= self.factor
            if raw >= self.cap:
                raw = self.cap
                break
        scaled = raw * (1.0 - self.jitter * min(max(draw, 0.0), 1.0))
        return min(max(scaled, at_least, 0.0), self.cap)
