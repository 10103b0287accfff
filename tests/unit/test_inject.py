"""Which `--inject-failure` kills the local runner fires on a progress report."""

import signal

import pytest

from megatron_operator.api import SpecError
from megatron_operator.local.inject import Injection, check_ranks, due, parse_injection


def plan(*texts: str) -> list[Injection]:
    return [parse_injection(t) for t in texts]


def test_a_late_batch_fires_one_step_per_attempt() -> None:
    # Reports of steps 5 and 6 of attempt 1 read together: the kill at 6 waits for attempt 2.
    injections = plan("5:1", "6:0")
    first = due(injections, 5, attempt=1, injected_attempt=-1)
    assert [i.step for i in first] == [5]
    first[0].fired = True
    assert due(injections, 6, attempt=1, injected_attempt=1) == []
    assert [i.step for i in due(injections, 7, attempt=2, injected_attempt=1)] == [6]


def test_the_lowest_step_first_and_ranks_of_one_step_together() -> None:
    injections = plan("9:0", "7:0", "7:1")
    assert [(i.step, i.rank) for i in due(injections, 9, 0, -1)] == [(7, 0), (7, 1)]
    assert due(injections, 6, 0, -1) == []


def test_fired_injections_do_not_fire_again() -> None:
    injections = plan("3:0")
    injections[0].fired = True
    assert due(injections, 10, attempt=5, injected_attempt=0) == []


def test_a_whole_pod_is_named_by_its_node_rank() -> None:
    (pod,) = plan("12:pod1")
    assert (pod.step, pod.pod, pod.signal) == (12, 1, signal.SIGKILL)
    assert "pod of node rank 1" in pod.describe()
    assert plan("12:1")[0].pod is None
    for bad in ("12:pod", "12:pod-1", "0:pod1", "12:podx"):
        with pytest.raises(SpecError):
            parse_injection(bad)
    with pytest.raises(SpecError, match="pod 2 does not exist"):
        check_ranks([pod, *plan("3:pod2")], world_size=4, nodes=2)
