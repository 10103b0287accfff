"""Failure detection: one pod state → one failure reason (or none), as a table."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from megatron_operator.core.failures import Nodes, classify
from megatron_operator.core.observe import PodView, pod_view

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
RUNNING = PodView(
    name="job-1",
    job_uid="u",
    attempt=0,
    node_rank=1,
    phase="Running",
    node="node-a",
    deleting=False,
    exit_code=None,
    terminated_reason=None,
    status_reason=None,
    disruption=None,
)
READY = Nodes(not_ready={}, known=frozenset({"node-a"}), lost_grace_seconds=30)


@pytest.mark.parametrize(
    ("pod", "nodes", "reason", "exit_code"),
    [
        (RUNNING, READY, None, None),
        (replace(RUNNING, phase="Succeeded", exit_code=0), READY, None, None),
        (replace(RUNNING, phase="Failed", exit_code=1), READY, "Error", 1),
        (replace(RUNNING, phase="Failed", exit_code=78), READY, "Error", 78),
        (
            replace(RUNNING, phase="Failed", exit_code=137, terminated_reason="OOMKilled"),
            READY,
            "OOMKilled",
            137,
        ),
        (replace(RUNNING, phase="Failed", status_reason="Evicted"), READY, "Evicted", None),
        (
            replace(RUNNING, phase="Failed", disruption="PreemptionByScheduler"),
            READY,
            "Preempted",
            None,
        ),
        (
            replace(RUNNING, phase="Failed", disruption="DeletionByTaintManager"),
            READY,
            "NodeLost",
            None,
        ),
        (
            replace(RUNNING, phase="Failed", disruption="EvictionByEvictionAPI"),
            READY,
            "DisruptionTarget",
            None,
        ),
        (replace(RUNNING, deleting=True), READY, "PodDeleted", None),
        (
            replace(RUNNING, deleting=True, disruption="EvictionByEvictionAPI"),
            READY,
            "DisruptionTarget",
            None,
        ),
        (replace(RUNNING, phase="Unknown"), READY, "NodeLost", None),
        (RUNNING, replace(READY, known=frozenset()), "NodeLost", None),
        (RUNNING, replace(READY, known=None), None, None),  # nodes not known yet: no verdict
        (
            RUNNING,
            replace(READY, not_ready={"node-a": NOW - timedelta(seconds=31)}),
            "NodeLost",
            None,
        ),
        (replace(RUNNING, node=None, phase="Pending"), READY, None, None),
    ],
)
def test_classify(pod: PodView, nodes: Nodes, reason: str | None, exit_code: int | None) -> None:
    failure, _ = classify(pod, nodes, NOW)
    assert (failure.reason if failure else None) == reason
    assert (failure.exit_code if failure else None) == exit_code


def test_a_node_within_its_grace_is_looked_at_again_when_the_grace_ends() -> None:
    since = NOW - timedelta(seconds=10)
    failure, again = classify(RUNNING, replace(READY, not_ready={"node-a": since}), NOW)
    assert failure is None
    assert again == since + timedelta(seconds=30)


def test_the_trainers_termination_message_reaches_the_failure() -> None:
    """The kubelet copies the trainer's termination log into the terminated state; the failure
    (and so status.lastFailure) quotes it, trimmed to its last lines."""

    raw = {
        "metadata": {"name": "job-a0-1", "labels": {}},
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "state": {
                        "terminated": {
                            "exitCode": 78,
                            "reason": "Error",
                            "message": "noise\n" * 50 + "checkpoint.dir: cannot write to /x\n",
                        }
                    },
                }
            ],
        },
    }
    x = pod_view(raw)
    assert x.exit_code == 78
    assert x.terminated_message == "noise | noise | checkpoint.dir: cannot write to /x"
    failure, _ = classify(x, READY, NOW)
    assert failure is not None and failure.exit_code == 78
    assert failure.message.endswith(
        "exited 78 (Error): noise | noise | checkpoint.dir: cannot write to /x"
    )
    blank = {**raw, "status": {**raw["status"]}}
    blank["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": "  \n"}}}
    ]
    assert pod_view(blank).terminated_message is None
