"""Failure rules as data: table tests of matching, the restart budget, and backoff."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_operator.api.spec import RestartPolicySpec
from megatron_operator.core.policy import (
    MAX_UNCOUNTED_PER_HOUR,
    MIN_BACKOFF_SECONDS,
    Failure,
    backoff_seconds,
    decide,
    first_failure,
    match,
)


def _policy(**kw: Any) -> RestartPolicySpec:
    return RestartPolicySpec.model_validate(kw)


@pytest.mark.parametrize(
    ("failure", "rules", "action"),
    [
        (Failure("Error", 1), [], "Restart"),
        (Failure("Error", 137), [], "Restart"),
        (Failure("OOMKilled", 137), [], "Restart"),
        (Failure("Error", 78), [], "Fail"),
        (Failure("Error", 143), [], "RestartNotCounted"),
        (Failure("DisruptionTarget"), [], "RestartNotCounted"),
        (Failure("Preempted", 143), [], "RestartNotCounted"),
        (Failure("Evicted"), [], "RestartNotCounted"),
        (Failure("NodeLost"), [], "RestartNotCounted"),
        (Failure("KueueEviction"), [], "RestartNotCounted"),
        (Failure("PodDeleted"), [], "Restart"),
        (Failure("Hang"), [], "Restart"),
        # the job's rules come first
        (Failure("Error", 3), [{"action": "Fail", "exitCodes": [3]}], "Fail"),
        (Failure("Error", 78), [{"action": "Restart", "exitCodes": [78]}], "Restart"),
        (
            Failure("Hang"),
            [{"action": "RestartNotCounted", "reasons": ["Hang"]}],
            "RestartNotCounted",
        ),
        # both conditions of a rule must hold
        (
            Failure("OOMKilled", 1),
            [{"action": "Fail", "exitCodes": [1], "reasons": ["Error"]}],
            "Restart",
        ),
        (Failure("Error", 1), [{"action": "Fail", "exitCodes": [1], "reasons": ["Error"]}], "Fail"),
    ],
)
def test_rule_matching(failure: Failure, rules: list[dict[str, Any]], action: str) -> None:
    assert match(failure, list(_policy(rules=rules).rules))[0] == action


def test_restart_budget_counts_only_counted_restarts() -> None:
    policy = _policy(maxRestarts=2)
    assert decide(Failure("Error", 1), policy, 0).action == "Restart"
    assert decide(Failure("Error", 1), policy, 1).action == "Restart"
    last = decide(Failure("Error", 1), policy, 2)
    assert last.action == "Fail" and "maxRestarts (2)" in last.message
    # not-counted restarts go on past the budget
    free = decide(Failure("NodeLost"), policy, 2)
    assert (free.action, free.counted) == ("Restart", False)


def test_zero_max_restarts_fails_on_first_counted_failure() -> None:
    assert decide(Failure("Error", 1), _policy(maxRestarts=0), 0).action == "Fail"


@pytest.mark.parametrize(
    ("restarts", "expected"), [(0, 10.0), (1, 20.0), (2, 40.0), (5, 300.0), (100, 300.0)]
)
def test_backoff_doubles_and_caps(restarts: int, expected: float) -> None:
    policy = _policy(backoffSeconds=10, maxBackoffSeconds=300)
    assert backoff_seconds(policy, restarts) == expected


def test_backoff_zero_still_has_the_restart_loop_floor() -> None:
    assert MIN_BACKOFF_SECONDS > 0
    assert backoff_seconds(_policy(backoffSeconds=0, maxBackoffSeconds=0), 7) == MIN_BACKOFF_SECONDS
    assert backoff_seconds(_policy(backoffSeconds=0, maxBackoffSeconds=0), 0) == MIN_BACKOFF_SECONDS


@pytest.mark.parametrize(
    ("failure", "recent", "counted"),
    [
        (Failure("NodeLost"), 0, False),
        (Failure("NodeLost"), MAX_UNCOUNTED_PER_HOUR - 1, False),
        (Failure("NodeLost"), MAX_UNCOUNTED_PER_HOUR, True),
        (Failure("Evicted"), MAX_UNCOUNTED_PER_HOUR + 5, True),
        (Failure("Error", 143), MAX_UNCOUNTED_PER_HOUR, True),
        (Failure("Error", 1), 0, True),  # counted anyway
    ],
)
def test_uncounted_restarts_count_past_the_hourly_cap(
    failure: Failure, recent: int, counted: bool
) -> None:
    decision = decide(failure, _policy(maxRestarts=3), 0, recent)
    assert (decision.action, decision.counted) == ("Restart", counted)
    if counted and recent:
        assert "uncounted restarts in the last hour" in decision.message


def test_the_hourly_cap_uses_up_max_restarts() -> None:
    decision = decide(Failure("NodeLost"), _policy(maxRestarts=2), 2, MAX_UNCOUNTED_PER_HOUR)
    assert decision.action == "Fail" and decision.counted


def test_first_failure_blames_the_cause() -> None:
    # Ranks the launchers reported: the first heard, not the ones it stopped (143, 137).
    survivors = [
        Failure("Error", 143, pod="j-1", order=1),
        Failure("Error", 137, pod="j-2", order=2),
    ]
    crash = Failure("Error", 1, pod="j-3", order=0)
    assert first_failure([*survivors, crash]) == crash
    config = Failure("Error", 78, pod="j-4")
    assert first_failure([crash, config, *survivors]) == config
    lost = Failure("NodeLost", None, pod="j-5")
    assert first_failure([crash, lost]) == lost
    assert first_failure([]) is None


def test_of_the_reported_ranks_the_first_to_exit_is_the_cause() -> None:
    """A killed rank (137) and a peer that lost it (1): the coordinator may hear the peer's
    launcher first under load, but the launchers' exit times say which came first."""
    killed = Failure("Error", 137, pod="j-0", order=1, finished=100.010)
    peer = Failure("Error", 1, pod="j-1", order=0, finished=100.250)
    assert first_failure([peer, killed]) == killed
    # Without exit times, the order heard decides; a report outranks a pod's own end.
    a, b = Failure("Error", 1, pod="j-0", order=1), Failure("Error", 1, pod="j-1", order=0)
    assert first_failure([a, b]) == b
    ended = Failure("Error", 1, pod="j-2", finished=50.0)
    assert first_failure([ended, a]) == a


def test_of_the_pods_that_ended_the_earlier_is_the_cause_and_in_the_same_second_a_signal() -> None:
    """A pod whose container was SIGKILLed (137) and its peer's pod, whose launcher exited 1 on
    the lost connection within the same whole second: the kill is the cause. A launcher exits
    with its first failed rank's code, so a pod ending on a signal was stopped from outside."""
    killed = Failure("Error", 137, pod="j-1", pod_lost=True, finished=100.0)
    peer = Failure("Error", 1, pod="j-0", pod_lost=True, finished=100.0)
    assert first_failure([peer, killed]) == killed
    drained = Failure("Error", 143, pod="j-1", pod_lost=True, finished=100.0)
    assert first_failure([peer, drained]) == drained
    # A second apart, the earlier exit is the cause, whatever its code.
    later = Failure("Error", 137, pod="j-1", pod_lost=True, finished=101.0)
    assert first_failure([later, peer]) == peer
