"""When a job should end, counting its failures (pure): the expected-time-to-train model of Meta's
"Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (arXiv 2410.21680),
with every input measured on the job itself by its goodput ledger (core/ledger.py).

- The work left: the remaining steps at the job's recent step time, plus its blocking
  checkpoint saves at the rate it has paid them so far.
- Failures arrive as a Poisson process in the time the job runs (queued and suspended time do
  not count). Its rate is the job's own, with a Gamma prior for a young job: the MTTF that Meta
  measured for its size (7.9 h at 1,024 GPUs, scaling as 1/GPUs), weighing as much as three hours
  of the job's own running (or one failure, if less), so the estimate starts there and follows
  the job's own record as it grows.
- Each failure costs its recovery (from the failure to the next attempt's first step, measured
  per rung of the restart ladder, averaged over the rungs the job's restarts took) and the work
  it loses (the steps trained again, and the work in flight); a job without failures yet uses
  its own first start-up and half a checkpoint interval of steps, blended with what it measures
  as restarts come.

The expected remaining time T solves T = W + λ·T·c (work W, rate λ, cost c), so T = W / (1 − λc);
the 90th percentile adds the spread of the downtime: the number of failures in that time (Poisson,
with the rate's own uncertainty) and each failure's lost work (anywhere in a checkpoint interval).
A failure-blind estimate (remaining steps × step time) is W alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from megatron_operator.api.status import Cause
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.ledger import Ledger, Mode

# Meta's measurement (arXiv 2410.21680): mean time to failure 7.9 h for a 1,024-GPU job.
PRIOR_MTTF_HOURS_AT_1024 = 7.9
PRIOR_GPUS_PER_NODE = 8  # a CPU job's nodes count as this many GPUs each
# The prior weighs as much as this much of the job's own running, or one failure's worth if
# that is less: a small job's MTTF is hundreds of hours, and a prior that heavy would hide a
# job that fails every hour for a week.
PRIOR_HOURS = 3.0
MAX_LOAD = 0.95  # λ·c past this: the job barely progresses; T is capped at W / (1 − MAX_LOAD)
P = 0.9
Z90 = 1.2815515655446004  # the standard normal's 90th percentile
MAX_SECONDS = 100 * 365 * 86400.0  # no estimate beyond a century (a datetime must hold it)


@dataclass(frozen=True)
class Inputs:
    """What the model needs, measured (docs/metrics.md, "Forecast")."""

    remaining_steps: int
    step_seconds: float
    save_seconds_per_step: float
    failures: int
    exposure_seconds: float  # the time the job could fail in (not queued, not suspended)
    recovery_seconds: float  # the measured recovery of all its restarts
    lost_seconds: float  # the work its failures lost (recomputed)
    first_start_seconds: float  # its first attempt's scheduling, start-up, rendezvous, load
    save_interval: int | None  # steps between checkpoints
    gpus: int


@dataclass(frozen=True)
class Estimate:
    remaining: float
    p90: float
    blind: float
    rate_per_hour: float
    cost: float


def prior_rate(gpus: int) -> float:
    """Failures per second of a job of this many GPUs, from Meta's MTTF."""
    mttf_hours = PRIOR_MTTF_HOURS_AT_1024 * 1024 / max(gpus, 1)
    return 1.0 / (mttf_hours * 3600.0)


def estimate(x: Inputs) -> Estimate:
    work = max(x.remaining_steps, 0) * (x.step_seconds + x.save_seconds_per_step)
    prior = prior_rate(x.gpus)
    weight = min(1.0 / prior, PRIOR_HOURS * 3600.0)  # seconds of exposure the prior counts as
    shape = prior * weight + x.failures  # the rate's Gamma posterior: shape / exposure
    rate = shape / (weight + max(x.exposure_seconds, 0.0))
    interval = x.save_interval if x.save_interval else 0
    prior_lost = interval * x.step_seconds / 2
    lost = (prior_lost + x.lost_seconds) / (1 + x.failures)
    cost = (x.first_start_seconds + prior_lost + x.recovery_seconds + x.lost_seconds) / (
        1 + x.failures
    )
    load = min(rate * cost, MAX_LOAD)
    remaining = work / (1 - load)
    cap = work / (1 - MAX_LOAD) * 3
    p90 = remaining
    for _ in range(100):  # a monotone fixed point: T = W + the 90th percentile of T's downtime
        nxt = min(max(work + _downtime_p90(rate * p90, shape, cost, lost), remaining), cap)
        if abs(nxt - p90) < 1e-6 * max(nxt, 1.0):
            break
        p90 = nxt
    return Estimate(
        min(remaining, MAX_SECONDS),
        min(max(p90, remaining), MAX_SECONDS),
        min(work, MAX_SECONDS),
        rate * 3600.0,
        cost,
    )


def _downtime_p90(failures: float, shape: float, cost: float, lost: float) -> float:
    """The 90th percentile of the downtime of `failures` expected failures: their number is
    Poisson with a rate known up to its Gamma posterior (so negative binomial, variance
    μ + μ²/shape), and each costs `cost` give or take its lost work (uniform up to twice its
    mean `lost`, variance lost²/3). A normal approximation, and never below the Poisson
    quantile of the count at the mean cost (the discrete tail of a few failures)."""
    variance = failures * lost**2 / 3 + cost**2 * (failures + failures**2 / max(shape, 1e-9))
    normal = failures * cost + Z90 * math.sqrt(variance)
    return max(normal, _poisson_quantile(failures, P) * cost)


def _poisson_quantile(mean: float, p: float) -> int:
    """The smallest k with P(K ≤ k) ≥ p for K ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    if mean > 500:  # the normal approximation, well within a failure's worth
        return max(0, math.ceil(mean + Z90 * math.sqrt(mean) - 0.5))
    term = math.exp(-mean)
    total, k = term, 0
    while total < p and k < 10000:
        k += 1
        term *= mean / k
        total += term
    return k


def inputs(
    ledger: Ledger, remaining_steps: int, save_interval: int | None, gpus: int
) -> Inputs | None:
    """The model's inputs from the ledger; None until the job has a measured step time."""
    step = ledger.step_seconds
    if step is None or ledger.trained_steps <= 0:
        return None
    s = {c: ms / 1000 for c, ms in ledger.ms.items()}
    failures = sum(n for n, _ in ledger.restarts.values())
    recovery = sum(ms for _, ms in ledger.restarts.values()) / 1000
    seconds = ledger.seconds()
    idle = seconds[Cause.QUEUED] + seconds[Cause.SUSPENDED] + seconds[Cause.FINISHING]
    start = sum(s.get(c, 0.0) for c in (Cause.SCHEDULING, Cause.START_UP, Cause.RENDEZVOUS))
    start += s.get(Cause.CHECKPOINT_LOAD, 0.0) + s.get(Cause.NOT_REPORTED, 0.0)
    return Inputs(
        remaining_steps=remaining_steps,
        step_seconds=step,
        save_seconds_per_step=s.get(Cause.CHECKPOINT_SAVE, 0.0) / ledger.trained_steps,
        failures=failures,
        exposure_seconds=max(ledger.wall - idle, 0.0),
        recovery_seconds=recovery,
        lost_seconds=s.get(Cause.RECOMPUTED, 0.0),
        first_start_seconds=start / (1 + failures),  # paid by the first attempt, each restart
        save_interval=save_interval,
        gpus=gpus,
    )


def for_job(ledger: Ledger, st: JobStatus, spec: object, now: datetime) -> dict[str, Any] | None:
    """status.forecast, or None (no trainIters to aim at, no step measured yet, or ended)."""
    if ledger.mode == Mode.DONE or not isinstance(spec, Mapping):
        return None
    training = spec.get("training")
    checkpoint = spec.get("checkpoint")
    total = _positive(training.get("trainIters") if isinstance(training, Mapping) else None)
    interval = _positive(
        checkpoint.get("saveInterval") if isinstance(checkpoint, Mapping) else None
    )
    if total is None:
        return None
    done = max(_positive((st.progress or {}).get("iteration")) or 0, ledger.high)
    resources = spec.get("resources")
    nodes = _positive(resources.get("nodes") if isinstance(resources, Mapping) else None)
    gpus = st.gpus or (nodes or 1) * PRIOR_GPUS_PER_NODE
    x = inputs(ledger, max(total - done, 0), interval, gpus)
    if x is None:
        return None
    e = estimate(x)
    return {
        "remainingSeconds": round(e.remaining, 1),
        "p90Seconds": round(e.p90, 1),
        "eta": _stamp(now + timedelta(seconds=e.remaining)),
        "etaP90": _stamp(now + timedelta(seconds=e.p90)),
        "blindSeconds": round(e.blind, 1),
        "stepSeconds": round(x.step_seconds, 6),
        "failuresPerHour": round(e.rate_per_hour, 6),
        "secondsPerFailure": round(e.cost, 1),
        "summary": f"{duration(e.remaining)} (p90 {duration(e.p90)})",
    }


def _positive(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None  # type: ignore[return-value]


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float) -> str:
    """e.g. '45s', '12m', '3h05m', '2d04h'."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
