"""What happens when reconciling a job raises something that is not the apiserver's answer.

The state machine fails a job only for its own bad data (`core.jobstatus.BadJobData`). Any other
exception is a bug of ours, and a GPU job must not pay for it: nothing is written, no pod is
deleted, and the job is retried with an exponential backoff (per job, jittered, capped), as
controller-runtime requeues a failed reconcile with its rate limiter. It is loud without
flooding: `megatron_operator_reconcile_errors_total{exception}` counts every failure, the
traceback is logged the first time a job meets an error and again at most every
`TRACEBACK_EVERY_SECONDS` (a one-line warning in between), and the caller posts one Warning event
per new error.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from megatron_operator.cluster.metrics import Metrics
from megatron_operator.core.backoff import Backoff

log = logging.getLogger(__name__)

BUG_BACKOFF = Backoff(base=1.0, factor=2.0, cap=300.0, jitter=0.2)
TRACEBACK_EVERY_SECONDS = 600.0

Key = tuple[str, str]


@dataclass
class _Trouble:
    failures: int
    signature: str
    logged_at: float


class BugGuard:
    """Per-job backoff and logging for exceptions of ours (see the module docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        backoff: Backoff = BUG_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.metrics = metrics
        self.backoff = backoff
        self.clock = clock
        self.draw = draw
        self.jobs: dict[Key, _Trouble] = {}

    def failed(self, key: Key, exc: BaseException) -> tuple[float, bool]:
        """Count the failure; return (seconds until the retry, whether the error is new for
        this job: the caller tells the job's owner once)."""
        kind = type(exc).__name__
        self.metrics.reconcile_errors.labels(kind).inc()
        signature = f"{kind}: {exc}"[:500]
        now = self.clock()
        trouble = self.jobs.get(key)
        new = trouble is None or trouble.signature != signature
        if trouble is None:
            trouble = self.jobs[key] = _Trouble(0, signature, -TRACEBACK_EVERY_SECONDS)
        trouble.failures += 1
        delay = self.backoff.delay(trouble.failures, self.draw())
        where = f"{key[0]}/{key[1]}"
        if new or now - trouble.logged_at >= TRACEBACK_EVERY_SECONDS:
            trouble.signature, trouble.logged_at = signature, now
            log.error(
                "%s: reconcile failed with an operator error (%s); the job's pods are left as "
                "they are; retry %d in %.1fs",
                where,
                signature,
                trouble.failures,
                delay,
                exc_info=exc,
            )
        else:
            log.warning(
                "%s: reconcile failed again (%s); retry %d in %.1fs",
                where,
                signature,
                trouble.failures,
                delay,
            )
        return delay, new

    def succeeded(self, key: Key) -> None:
        if self.jobs.pop(key, None) is not None:
            log.info("%s/%s: reconciled again after an operator error", *key)

    def forget(self, key: Key) -> None:
        self.jobs.pop(key, None)
