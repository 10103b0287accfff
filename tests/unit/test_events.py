"""Events on a job are aggregated and rate-limited (cluster/events.py), as client-go's recorder:
a repeat within 10 minutes updates the posted Event's count, and a job gets a burst of 25 posts,
then one per 5 minutes."""

from __future__ import annotations

from megatron_operator.cluster.events import AGGREGATE_SECONDS, BURST, REFILL_SECONDS, EventLimiter

JOB = ("team", "job")


def test_repeats_update_the_count_and_new_ones_are_rate_limited() -> None:
    clock = [0.0]
    limiter = EventLimiter(clock=lambda: clock[0])
    assert limiter.decide(JOB, "Warning", "Restarting", "rank 1 failed") == ("post", None, 1)
    limiter.posted(JOB, "Warning", "Restarting", "rank 1 failed", "job.abc")
    for n in range(2, 50):  # a restart loop: the same event again and again
        clock[0] += 1
        assert limiter.decide(JOB, "Warning", "Restarting", "rank 1 failed") == (
            "count",
            "job.abc",
            n,
        )
    posted = dropped = 0
    for i in range(100):  # 100 different events at once
        action, _, _ = limiter.decide(JOB, "Normal", "Resumed", f"attempt {i}")
        posted += action == "post"
        dropped += action == "drop"
    assert posted == BURST - 1 and dropped == 100 - posted  # one token went to the first post
    assert limiter.decide(("team", "other"), "Normal", "Created", "x")[0] == "post"  # per job
    clock[0] += REFILL_SECONDS
    assert limiter.decide(JOB, "Normal", "Resumed", "later")[0] == "post"
    assert limiter.decide(JOB, "Normal", "Resumed", "later still")[0] == "drop"
    clock[0] += AGGREGATE_SECONDS  # long after: the old event is posted anew, not counted
    action, _, _ = limiter.decide(JOB, "Warning", "Restarting", "rank 1 failed")
    assert action == "post"
