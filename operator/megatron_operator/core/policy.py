"""Failure policy (pure): what a failed rank means, and what to do about it.

The rules are ordered data, as in JobSet's failure policy: the job's own `restartPolicy.rules`
first, then the defaults below; the first match decides. The operator and `mjob run --local` both
call `decide`, so a failure is handled the same way on a cluster and on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from megatron_contract.exitcodes import ExitCode
from megatron_operator.api.spec import FailureAction, FailureReason, FailureRule, RestartPolicySpec

DEFAULT_RULES: Final[tuple[FailureRule, ...]] = (
    # The platform took the pod away; the job did nothing wrong.
    FailureRule.model_validate(
        {
            "action": "RestartNotCounted",
            "reasons": ["DisruptionTarget", "Preempted", "Evicted", "NodeLost", "KueueEviction"],
        }
    ),
    # A configuration error repeats on every attempt: fail at once.
    FailureRule.model_validate({"action": "Fail", "exitCodes": [ExitCode.CONFIG]}),
    # The trainer was told to stop and saved a checkpoint first.
    FailureRule.model_validate({"action": "RestartNotCounted", "exitCodes": [ExitCode.SIGTERM]}),
    # NaN/Inf loss or gradients: a restart would replay the same data onto the same weights.
    FailureRule.model_validate({"action": "Fail", "exitCodes": [ExitCode.NON_FINITE]}),
)


# The restart-loop floor. Whatever backoffSeconds says, attempts are at least this far apart: a
# gang that fails at once (a bad image, a node that kills every pod) cannot spin the apiserver.
MIN_BACKOFF_SECONDS: Final = 1.0
# Restarts not counted toward maxRestarts (node loss, eviction, SIGTERM) are the platform's fault,
# but a job that "loses its node" every minute is broken: past this many in an hour, they count.
MAX_UNCOUNTED_PER_HOUR: Final = 10
UNCOUNTED_WINDOW_SECONDS: Final = 3600.0


@dataclass(frozen=True)
class Failure:
    """One rank's failure, as the operator (or the local runner) observed it."""

    reason: FailureReason
    exit_code: int | None = None
    pod: str | None = None
    node: str | None = None
    message: str = ""
    node_rank: int | None = None  # of the pod it happened in
    # The pod itself is lost (terminated, deleted, its node or its launcher gone): the restart
    # must replace it. False for a rank that failed inside a running pod, or a hang.
    pod_lost: bool = False
    # For ranks the launchers reported: the order their coordinator heard of them. The first to
    # exit is the cause; the others typically lost their peers to it.
    order: int | None = None
    rank: int | None = None  # the global rank, for a rank the launchers reported
    # When its container exited (seconds since the epoch; the kubelet reports whole seconds):
    # of two pods' exits, the earlier is the cause.
    finished: float | None = None


@dataclass(frozen=True)
class Decision:
    """What to do about a failure: `action` after applying `maxRestarts`."""

    action: Literal["Restart", "Fail"]
    counted: bool
    rule: str  # which rule matched, for events and status
    message: str


def _matches(rule: FailureRule, failure: Failure) -> bool:
    if rule.exit_codes is not None and failure.exit_code not in rule.exit_codes:
        return False
    return not (rule.reasons is not None and failure.reason not in rule.reasons)


def _describe(rule: FailureRule, source: str) -> str:
    parts = []
    if rule.exit_codes is not None:
        parts.append(f"exitCodes {list(rule.exit_codes)}")
    if rule.reasons is not None:
        parts.append(f"reasons {list(rule.reasons)}")
    return f"{source} ({', '.join(parts)}) → {rule.action}"


def match(failure: Failure, rules: list[FailureRule]) -> tuple[FailureAction, str]:
    """The action of the first matching rule (the job's, then the defaults), and which rule."""
    for i, rule in enumerate(rules):
        if _matches(rule, failure):
            return rule.action, _describe(rule, f"rules[{i}]")
    for i, rule in enumerate(DEFAULT_RULES):
        if _matches(rule, failure):
            return rule.action, _describe(rule, f"default rule {i + 1}")
    return "Restart", f"default rule {len(DEFAULT_RULES) + 1} (anything else) → Restart"


def decide(
    failure: Failure,
    policy: RestartPolicySpec,
    restarts_counted: int,
    uncounted_last_hour: int = 0,
) -> Decision:
    """Apply the rules and the restart budget to one failure. `uncounted_last_hour`: restarts
    not counted toward maxRestarts in the last hour; from MAX_UNCOUNTED_PER_HOUR on, they count."""
    action, rule = match(failure, list(policy.rules))
    who = failure.pod or "a rank"
    if failure.rank is not None:
        who = f"rank {failure.rank} ({who})"
    what = f"{who} failed ({failure.reason}"
    what += f", exit code {failure.exit_code})" if failure.exit_code is not None else ")"
    if action == "Fail":
        return Decision("Fail", False, rule, f"{what}; {rule}: the job fails")
    if action == "RestartNotCounted" and uncounted_last_hour >= MAX_UNCOUNTED_PER_HOUR:
        action = "Restart"
        rule += (
            f", counted: {uncounted_last_hour} uncounted restarts in the last hour "
            f"(cap {MAX_UNCOUNTED_PER_HOUR})"
        )
    counted = action == "Restart"
    if counted and restarts_counted + 1 > policy.max_restarts:
        return Decision(
            "Fail",
            True,
            rule,
            f"{what}; maxRestarts ({policy.max_restarts}) reached after {restarts_counted} "
            "counted restarts",
        )
    if not counted and not rule.endswith("RestartNotCounted"):
        rule += " (not counted)"
    return Decision("Restart", counted, rule, f"{what}; {rule}")


def backoff_seconds(policy: RestartPolicySpec, restarts: int) -> float:
    """Wait before the next attempt: backoffSeconds · 2^k (k = restarts so far), capped, and
    never below MIN_BACKOFF_SECONDS."""
    exponent = min(max(restarts, 0), 30)  # 2^30 s is far past any cap; avoid huge ints
    wait = float(min(policy.backoff_seconds * 2**exponent, policy.max_backoff_seconds))
    return max(wait, MIN_BACKOFF_SECONDS)


def first_failure(failures: list[Failure]) -> Failure | None:
    """The failure to blame when several ranks failed together.

    A rank that crashed on its own is the cause; the others typically exit with a comms error
    or SIGTERM after it. Platform reasons (node lost, eviction) outrank plain errors, since
    they explain the errors."""
    if not failures:
        return None
    priority = {
        "NodeLost": 0,
        "Preempted": 1,
        "DisruptionTarget": 2,
        "Evicted": 3,
        "KueueEviction": 4,
        "OOMKilled": 5,
        "Hang": 6,
        "LauncherLost": 7,
        "PodDeleted": 8,
        "RestartTimeout": 9,
        "Error": 10,
    }

    def key(f: Failure) -> tuple[int, bool, bool, bool, float, float, bool, float, bool, str]:
        # A config error decides the outcome (Fail). A lost pod explains the errors of the ranks
        # that lost their peers in it. Of the ranks the launchers reported, the first to exit
        # is the cause: by the launchers' own exit times (a killed rank's peers exit after it,
        # but under load their launchers may be heard first), then by the order the coordinator
        # heard them; a reported SIGTERM/SIGKILL is usually a launcher stopping its survivors.
        # Of pods that ended, the earlier exit (kubelet time, whole seconds) is the cause, and
        # in the same second a signal is: a launcher exits with its first failed rank's code,
        # so a pod ending on SIGKILL/SIGTERM was killed or stopped from outside, and its peers'
        # comms errors follow from it.
        reported = f.order is not None
        signalled = f.exit_code in (ExitCode.SIGTERM, ExitCode.SIGKILL)
        return (
            priority.get(f.reason, 11),
            f.exit_code != ExitCode.CONFIG,
            not f.pod_lost,
            not reported,
            f.finished if reported and f.finished is not None else math.inf,
            f.order if f.order is not None else math.inf,
            reported and signalled,
            f.finished if f.finished is not None else math.inf,
            not (signalled and not reported),
            f.pod or "",
        )

    return min(failures, key=key)
