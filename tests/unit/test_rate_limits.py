"""Per-job limits on what a trainer's writes and finished jobs cost (cluster/ratelimit.py and the
state machine's quiet jobs): progress is copied into the status at most once per interval, a
burst of Lease events wakes a job once per window, and a finished or suspended job has no resync
(only its deadlines, such as the TTL)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import timedelta

from megatron_operator.cluster.ratelimit import (
    LEASE_WAKE_SECONDS,
    PROGRESS_COPY_SECONDS,
    ProgressLimiter,
    WakeThrottle,
)
from megatron_operator.core.reconcile import reconcile

from .sim import Sim
from .specs import spec_of


def _sim(**spec: object) -> Sim:
    changes = {"resources.nodes": 2, "training.globalBatchSize": 64, **spec}
    return Sim.of_spec(spec_of(changes))


def test_a_held_progress_copy_waits_for_the_limit_then_lands() -> None:
    sim = _sim()
    sim.start_running()
    sim.report_progress(10)
    hold = sim.now + timedelta(seconds=PROGRESS_COPY_SECONDS)
    out = reconcile(replace(sim.world(), progress_not_before=hold), sim.settings)
    assert "progress" not in out.status  # held back
    assert out.requeue_after <= PROGRESS_COPY_SECONDS + 0.1  # ... and looked at again then
    sim.tick(PROGRESS_COPY_SECONDS)
    out = reconcile(replace(sim.world(), progress_not_before=hold), sim.settings)
    assert out.status["progress"]["iteration"] == 10


def test_the_last_progress_lands_when_the_job_finishes_inside_the_limit() -> None:
    """The final steps are reported, then every pod succeeds, all within one copy interval:
    the job's finish copies them (a finished job gets no later pass that would)."""
    sim = _sim()
    sim.start_running()
    sim.report_progress(10)
    sim.step()
    sim.tick(1)
    sim.report_progress(12)
    sim.succeed_all()
    hold = sim.now + timedelta(seconds=PROGRESS_COPY_SECONDS)
    out = reconcile(replace(sim.world(), progress_not_before=hold), sim.settings)
    assert out.status["phase"] == "Succeeded"
    assert out.status["progress"]["iteration"] == 12


def test_a_later_step_in_the_same_second_is_copied() -> None:
    """Records carry whole seconds: a fast run's last steps share one with an earlier copy."""
    sim = _sim()
    sim.start_running()
    sim.report_progress(7)
    sim.step()
    assert sim.status["progress"]["iteration"] == 7
    sim.report_progress(12)  # the same second
    sim.succeed_all()
    sim.step()
    assert sim.status["phase"] == "Succeeded" and sim.status["progress"]["iteration"] == 12


def test_the_limiter_spaces_copies_per_job() -> None:
    sim = _sim()
    limiter = ProgressLimiter()
    key = ("ns", "job")
    assert limiter.not_before(key) is None
    limiter.copied(key, sim.now)
    assert limiter.not_before(key) == sim.now + timedelta(seconds=PROGRESS_COPY_SECONDS)
    assert limiter.not_before(("ns", "other")) is None  # per job
    limiter.forget(key)
    assert limiter.not_before(key) is None


def test_a_burst_of_lease_events_wakes_a_job_once_per_window() -> None:
    clock = [0.0]
    throttle = WakeThrottle(clock=lambda: clock[0])
    key = ("ns", "job")
    wakes: list[float] = []
    due: float | None = None  # when the scheduled wake fires
    for i in range(200):  # 200 Lease writes in 10 s
        t = i * 0.05
        if due is not None and due <= t:
            clock[0] = due
            throttle.fired(key)
            wakes.append(due)
            due = None
        clock[0] = t
        delay = throttle.admit(key)
        if delay == 0.0:
            wakes.append(t)
        elif delay is not None:
            assert 0 < delay <= LEASE_WAKE_SECONDS
            due = t + delay
    assert wakes[0] == 0.0  # the first write wakes the job at once
    gaps = [b - a for a, b in itertools.pairwise(wakes)]
    assert all(g >= LEASE_WAKE_SECONDS - 1e-9 for g in gaps), gaps
    assert len(wakes) <= 10 / LEASE_WAKE_SECONDS + 1
    assert throttle.admit(("ns", "other")) == 0.0  # another job is not held back


def test_finished_and_suspended_jobs_have_no_resync() -> None:
    sim = _sim()
    sim.start_running()
    sim.succeed_all()
    sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert math.isinf(sim.step().requeue_after)  # nothing to do until the job changes

    ttl = _sim(ttlSecondsAfterFinished=86400)
    ttl.start_running()
    ttl.succeed_all()
    ttl.step()
    assert 86000 < ttl.step().requeue_after <= 86400.1  # the TTL, not a 60 s resync

    sus = _sim()
    sus.start_running()
    sus.job["spec"]["suspend"] = True
    out = sus.step()
    assert len(out.delete_pods) == 2 and out.requeue_after <= 5.0  # its pods are stopping
    sus.finish_deletions()
    assert math.isinf(sus.step().requeue_after)  # suspended, no pods: idle


def test_a_running_job_keeps_its_resync() -> None:
    sim = _sim()
    sim.start_running()
    assert sim.step().requeue_after <= sim.settings.resync_seconds
