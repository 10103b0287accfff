"""The per-job reconcile loops (cluster/jobloops.py): a loop holds only a key, a uid and an
Event; it ends when the job is gone or idle (its reconcile returns infinity), and a new
generation starts it again; a deleted-and-recreated job gets a loop of its own."""

from __future__ import annotations

import asyncio
import math

from megatron_operator.cluster.jobloops import JobLoops


def test_loops_run_sleep_wake_and_end() -> None:
    async def scenario() -> None:
        calls: list[tuple[str, str | None]] = []
        answers: dict[str, list[float]] = {"a": [0.05, 60.0, math.inf], "b": [60.0] * 100}

        async def step(ns: str, name: str, uid: str | None) -> float:
            calls.append((name, uid))
            return answers[name].pop(0)

        loops = JobLoops(step, debounce=0.0)
        loops.ensure("ns", "a", "u-a")
        loops.ensure("ns", "b", "u-b")
        await asyncio.sleep(0.2)  # a: reconciled, slept 0.05 s, reconciled, sleeps 60 s
        assert calls.count(("a", "u-a")) == 2 and ("ns", "a") in loops
        loops.wake("ns", "a")  # its third reconcile says idle: the loop ends
        await asyncio.sleep(0.05)
        assert calls.count(("a", "u-a")) == 3 and ("ns", "a") not in loops
        loops.wake("ns", "a")  # nothing to wake: an idle job waits for a new generation
        await asyncio.sleep(0.05)
        assert calls.count(("a", "u-a")) == 3
        loops.ensure("ns", "b", "u-b")  # same job again: a wake, not a second loop
        await asyncio.sleep(0.05)
        assert calls.count(("b", "u-b")) == 2 and len(loops) == 1
        loops.ensure("ns", "b", "u-b2")  # deleted and re-created: a loop of the new uid
        await asyncio.sleep(0.05)
        assert ("b", "u-b2") in calls and len(loops) == 1
        loops.gone("ns", "b", "u-b2")
        assert len(loops) == 0
        await loops.stop()

    asyncio.run(scenario())


def test_a_failing_step_is_retried_not_fatal() -> None:
    async def scenario() -> None:
        seen = 0

        async def step(ns: str, name: str, uid: str | None) -> float:
            nonlocal seen
            seen += 1
            if seen == 1:
                raise RuntimeError("boom")
            return math.inf

        loops = JobLoops(step, debounce=0.0)
        loops.ensure("ns", "a", None)
        await asyncio.sleep(0.05)
        assert seen == 1 and ("ns", "a") in loops  # waits 5 s before the retry
        loops.wake("ns", "a")
        await asyncio.sleep(0.05)
        assert seen == 2 and ("ns", "a") not in loops

    asyncio.run(scenario())
