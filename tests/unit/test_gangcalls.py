"""Pod creates and deletes go out in slow-start batches per job (1, 2, 4, ...; the first failure
stops the rest, as the Job controller does) and round robin across jobs: one job's 4,096-pod
restart no longer holds up another tenant's 8 pods (cluster/gangcalls.py)."""

from __future__ import annotations

import threading
import time

import pytest

from megatron_operator.cluster.gangcalls import FairPool, slow_start


def test_slow_start_doubles_batches_and_stops_at_the_first_failure() -> None:
    pool = FairPool(8)
    batches: list[int] = []
    lock = threading.Lock()
    running = 0

    def call(i: int) -> int:
        nonlocal running
        with lock:
            running += 1
            batches.append(running)
        time.sleep(0.01)
        with lock:
            running -= 1
        if i == 9:
            raise RuntimeError("refused by a quota")
        return i

    assert slow_start(pool, ("ns", "a"), call, list(range(7))) == list(range(7))
    assert max(batches[:1]) == 1 and max(batches[1:3]) <= 2 and max(batches[3:7]) <= 4
    tried: list[int] = []

    def record(i: int) -> int:
        tried.append(i)
        return call(i)

    with pytest.raises(RuntimeError, match="quota"):
        slow_start(pool, ("ns", "b"), record, list(range(100)))
    # Batches 1+2+4 = 0..6, then 8 items (7..14) hold the failing 9: nothing after 14 is tried.
    assert sorted(tried) == list(range(15))
    pool.shutdown()


def test_jobs_take_turns_in_the_pool() -> None:
    pool = FairPool(4)
    done: dict[str, float] = {}

    def call(_: int) -> None:
        time.sleep(0.002)

    def run(job: str, n: int) -> None:
        slow_start(pool, ("ns", job), call, list(range(n)))
        done[job] = time.monotonic()

    start = time.monotonic()
    big = threading.Thread(target=run, args=("big", 4096))
    big.start()
    time.sleep(0.05)  # the big restart is well under way
    small_start = time.monotonic()
    run("small", 8)
    big.join()
    small_took = done["small"] - small_start
    big_took = done["big"] - start
    # Round robin: the small job's 8 calls (4 batches) interleave with the big one's.
    assert small_took < big_took / 10, (small_took, big_took)
    pool.shutdown()
