"""Failure detection (pure): what a pod's state says went wrong, if anything.

One table decides it, in this order: a terminated pod (its DisruptionTarget condition, its
status reason, its container's exit), a pod deleted under the job, a pod whose node is gone or
NotReady past the grace period. `tests/unit/test_failures.py` holds the table's cases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from megatron_operator.api.spec import FailureReason
from megatron_operator.core.observe import PodView, format_time
from megatron_operator.core.policy import Failure, first_failure


@dataclass(frozen=True)
class Nodes:
    """What is known about the nodes the pods run on."""

    not_ready: Mapping[str, datetime]  # name → NotReady since
    known: frozenset[str] | None  # the nodes that exist; None: not known, skip that check
    lost_grace_seconds: float  # NotReady this long = the node is lost


def node_lost(node: str | None, nodes: Nodes, now: datetime) -> bool:
    """The node is gone, or NotReady for the whole grace: its kubelet will not act."""
    if node is None:
        return False
    if nodes.known is not None and node not in nodes.known:
        return True
    since = nodes.not_ready.get(node)
    return since is not None and now >= since + timedelta(seconds=nodes.lost_grace_seconds)


def failed_reason(x: PodView) -> FailureReason:
    """Why a terminated (or deleted) pod stopped, from the platform's point of view."""
    if x.disruption == "PreemptionByScheduler":
        return "Preempted"
    if x.disruption == "DeletionByTaintManager":
        return "NodeLost"
    if x.disruption:
        return "DisruptionTarget"
    if x.status_reason == "Evicted":
        return "Evicted"
    if x.terminated_reason == "OOMKilled":
        return "OOMKilled"
    return "Error"


def detail(x: PodView) -> str:
    parts = [f"pod {x.name}"]
    if x.node:
        parts.append(f"on {x.node}")
    if x.exit_code is not None:
        parts.append(f"exited {x.exit_code}")
    if x.terminated_reason:
        parts.append(f"({x.terminated_reason})")
    if x.disruption:
        parts.append(f"DisruptionTarget: {x.disruption}")
    if x.status_reason:
        parts.append(f"status reason {x.status_reason}")
    text = " ".join(parts)
    return f"{text}: {x.terminated_message}" if x.terminated_message else text


def classify(x: PodView, nodes: Nodes, now: datetime) -> tuple[Failure | None, datetime | None]:
    """The pod's failure, if any, and when to look again (a node's grace ending). Every failure
    found here is the pod's own (`pod_lost`): a restart must replace the pod."""
    failure, again = _classify(x, nodes, now)
    if failure is not None:
        failure = replace(failure, node_rank=x.node_rank, pod_lost=True)
    return failure, again


def _classify(x: PodView, nodes: Nodes, now: datetime) -> tuple[Failure | None, datetime | None]:
    if x.succeeded:
        return None, None
    if x.phase == "Failed" or (x.trainer_exited and x.exit_code != 0 and not x.deleting):
        finished = x.finished_at.timestamp() if x.finished_at is not None else None
        failure = Failure(
            failed_reason(x), x.exit_code, x.name, x.node, detail(x), finished=finished
        )
        return failure, None
    if x.deleting:
        reason: FailureReason = failed_reason(x) if x.disruption else "PodDeleted"
        return Failure(reason, None, x.name, x.node, "deleted while the job was running"), None
    if x.phase == "Unknown":
        return Failure("NodeLost", None, x.name, x.node, "the pod's state is Unknown"), None
    if x.node is None:
        return None, None
    if nodes.known is not None and x.node not in nodes.known:
        return Failure("NodeLost", None, x.name, x.node, f"node {x.node} is gone"), None
    since = nodes.not_ready.get(x.node)
    if since is None:
        return None, None
    lost_at = since + timedelta(seconds=nodes.lost_grace_seconds)
    if now < lost_at:
        return None, lost_at
    message = f"node {x.node} NotReady since {format_time(since)}"
    return Failure("NodeLost", None, x.name, x.node, message), None


# A pod the scheduler cannot place this long is worth a condition of its own: a gang that waits
# for capacity says so at once (PodsScheduled), one that will not fit says it loudly.
UNSCHEDULABLE_LONG_SECONDS = 60.0


@dataclass(frozen=True)
class StartupProblem:
    """Why a pod of the attempt does not start: the kubelet's or the scheduler's words."""

    reason: str  # ImagePullBackOff, ErrImagePull, …, or Unschedulable
    message: str  # names the pod and quotes the kubelet's or the scheduler's message


def startup_problem(x: PodView, now: datetime) -> tuple[StartupProblem | None, datetime | None]:
    """The pod's problem starting, if any, and when to look again (unschedulable turning long)."""
    where = f"pod {x.name}" + (f" on {x.node}" if x.node else "")
    if x.waiting is not None:
        reason, message = x.waiting
        return StartupProblem(reason, f"{where}: {reason}: {message}"), None
    if x.unschedulable is not None and x.phase == "Pending" and not x.deleting:
        since = x.unschedulable_since or now
        long_at = since + timedelta(seconds=UNSCHEDULABLE_LONG_SECONDS)
        if now < long_at:
            return None, long_at
        waited = int((now - since).total_seconds())
        return StartupProblem(
            "Unschedulable", f"{where}: unschedulable for {waited}s: {x.unschedulable}"
        ), None
    return None, None


def startup_timeout(
    pods: list[PodView], timeout: float, now: datetime
) -> tuple[Failure | None, datetime | None]:
    """A gang not Running `timeout` seconds after its first pod was scheduled (from then on it
    holds GPUs): the failure, naming the pod that keeps it waiting; else when to look again."""
    scheduled = [x.scheduled_at for x in pods if x.scheduled_at is not None]
    if timeout <= 0 or not scheduled:
        return None, None
    first = min(scheduled)
    deadline = first + timedelta(seconds=timeout)
    if now < deadline:
        return None, deadline
    waiting = [x for x in pods if x.phase != "Running" and not x.succeeded]
    stuck = next((x for x in waiting if x.waiting is not None), waiting[0] if waiting else None)
    why = ""
    if stuck is not None:
        problem, _ = startup_problem(stuck, now)
        why = f": {problem.message}" if problem else f": pod {stuck.name} is {stuck.phase}"
    message = (
        f"not every pod was Running {int(timeout)}s after the first was scheduled "
        f"(startupTimeoutSeconds){why}"
    )
    pod = stuck or pods[0]
    return Failure("StartupTimeout", None, pod.name, pod.node, message), None


# The evidence event of a failed attempt stays readable and bounded, whatever the gang's size:
# an event's message is capped at 1024 characters, so the first pods get their details (node,
# exit code, last log lines), the next ones their names, and the rest a count.
REPORT_DETAILED = 3
REPORT_PER_POD = 230
REPORT_NAMED = 12


def attempt_report(attempt: int, failures: list[Failure]) -> str:
    """Every failed pod of the attempt, the cause first: pod, node, exit code and its last log
    lines (the termination message, which falls back to the log's tail), within the cap."""
    cause = first_failure(failures)
    ordered = sorted(failures, key=lambda f: (f is not cause, _natural(f.pod or "")))
    parts = []
    for f in ordered[:REPORT_DETAILED]:
        what = f.message  # detail(): "pod … on … exited … (…): its last lines"
        if not what.startswith("pod "):
            where = (f.pod or "a pod") + (f" on {f.node}" if f.node else "")
            what = f"{where} ({f.reason}): {f.message}" if f.message else f"{where} ({f.reason})"
        parts.append(what if len(what) <= REPORT_PER_POD else what[: REPORT_PER_POD - 1] + "…")
    named = ordered[REPORT_DETAILED : REPORT_DETAILED + REPORT_NAMED]
    if named:
        parts.append(
            "also "
            + ", ".join(
                f"{f.pod or 'a pod'}"
                + (f" (exit {f.exit_code})" if f.exit_code is not None else "")
                for f in named
            )
        )
    more = len(ordered) - REPORT_DETAILED - REPORT_NAMED
    tail = f"; and {more} more" if more > 0 else ""
    return f"attempt {attempt}: {len(ordered)} pod(s) failed: " + "; ".join(parts) + tail


def _natural(name: str) -> tuple[str, int]:
    """job-a3-10 after job-a3-9: the node rank sorts as a number."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)
