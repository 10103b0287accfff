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
from megatron_operator.core.policy import Failure


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
    if x.phase == "Succeeded":
        return None, None
    if x.phase == "Failed":
        return Failure(failed_reason(x), x.exit_code, x.name, x.node, detail(x)), None
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
