"""Evidence of a failure is kept, and a gang that cannot start says why and lets go of its GPUs:
kept failed pods (restartPolicy.keepFailedPods), one bounded event per failed attempt naming
every failed pod, the PodsStarted condition quoting the kubelet or the scheduler, and
restartPolicy.startupTimeoutSeconds. Driven through the pure state machine (tests/unit/sim.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from megatron_operator.core.failures import attempt_report, startup_problem
from megatron_operator.core.observe import format_time, pod_view
from megatron_operator.core.policy import Failure

from .sim import Sim
from .specs import spec_of

FAST = {"backoffSeconds": 0, "maxBackoffSeconds": 0}


def _sim(policy: dict[str, Any] | None = None, nodes: int = 4) -> Sim:
    changes = {
        "resources.nodes": nodes,
        "training.globalBatchSize": 8 * nodes * 4,
        # Recreate: the rung that replaces the failed attempt's pods, whose evidence is kept
        # (an in-place restart keeps every pod, and its log, anyway).
        "restartPolicy": {**FAST, "strategy": "Recreate", **(policy or {})},
    }
    return Sim.of_spec(spec_of(changes))


def _condition(sim: Sim, type_: str) -> dict[str, Any]:
    return next(c for c in sim.status["conditions"] if c["type"] == type_)


def _schedule(sim: Sim, at: datetime, waiting: tuple[str, str] | None = None) -> None:
    """Play the scheduler and a kubelet whose containers do not start."""
    for i, p in enumerate(sim.pods.values()):
        if p["status"]["phase"] != "Pending":
            continue
        p["spec"]["nodeName"] = f"node-{i}"
        status: dict[str, Any] = {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": format_time(at)}
            ],
        }
        if waiting is not None:
            reason, message = waiting
            status["containerStatuses"] = [
                {"name": "trainer", "state": {"waiting": {"reason": reason, "message": message}}}
            ]
        p["status"] = status


def test_the_failed_pods_of_the_last_attempts_are_kept_and_older_ones_go() -> None:
    sim = _sim({"keepFailedPods": 2, "maxRestarts": 5})
    sim.start_running()
    for attempt, rank in ((0, 1), (1, 3), (2, 0)):
        sim.fail(f"job-a{attempt}-{rank}", exit_code=7)
        sim.settle()
        sim.run_all()
        sim.step()
        assert sim.status["phase"] == "Running"
    assert sim.status["keptPods"] == ["job-a1-3", "job-a2-0"]
    failed = {n for n, p in sim.pods.items() if p["status"]["phase"] == "Failed"}
    assert failed == {"job-a1-3", "job-a2-0"}  # job-a0-1 was the oldest: deleted
    assert sim.attempts() == {"3"} and len(sim.pods) == 6


def test_one_event_per_failed_attempt_names_every_failed_pod() -> None:
    sim = _sim(nodes=4)
    sim.start_running()
    # job-a0-2 crashed first; job-a0-0 ended a second later (the kubelet's whole seconds).
    for name, code, at in (("job-a0-2", 1, "12:00:00"), ("job-a0-0", 137, "12:00:01")):
        sim.fail(name, exit_code=code)
        terminated = sim.pods[name]["status"]["containerStatuses"][0]["state"]["terminated"]
        terminated["message"] = f"line one\nline two\n{name} says: boom"
        terminated["finishedAt"] = f"2026-11-22T{at}Z"
    sim.step()
    reports = [m for r, m in sim.events if r == "AttemptFailed"]
    assert len(reports) == 1
    report = reports[0]
    assert report.startswith("attempt 0: 2 pod(s) failed: pod job-a0-2 on node-2 exited 1")
    assert "job-a0-2 says: boom" in report and "job-a0-0 says: boom" in report
    assert "exited 137" in report
    sim.settle()
    assert len([m for r, m in sim.events if r == "AttemptFailed"]) == 1  # once per attempt


def test_the_report_is_bounded_for_a_thousand_failed_pods() -> None:
    failures = [
        Failure("Error", 1, f"job-a3-{i}", f"node-{i}", f"pod job-a3-{i} exited 1: " + "x" * 500)
        for i in range(1000)
    ]
    report = attempt_report(3, failures)
    assert len(report) <= 1024
    assert report.startswith("attempt 3: 1000 pod(s) failed: pod job-a3-0 ")
    assert "also job-a3-3 (exit 1)" in report and report.endswith("and 985 more")


@pytest.mark.parametrize(
    "reason",
    ["ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
     "CreateContainerError"],
)  # fmt: skip
def test_a_pod_that_cannot_start_is_a_condition_quoting_the_kubelet(reason: str) -> None:
    sim = _sim()
    sim.step()
    message = f'kubelet says: {reason} for "registry.example/nope:1"'
    _schedule(sim, sim.now, (reason, message))
    sim.step()
    cond = _condition(sim, "PodsStarted")
    assert (cond["status"], cond["reason"]) == ("False", reason)
    assert cond["message"].startswith(f"pod job-a0-0 on node-0: {reason}: container trainer:")
    assert message in cond["message"] and "(and 3 more pods)" in cond["message"]
    sim.step()
    assert len([m for r, m in sim.events if r == reason]) == 1  # one event, not one per look
    sim.run_all()
    for p in sim.pods.values():
        p["status"] = {"phase": "Running"}
    sim.step()
    cond = _condition(sim, "PodsStarted")
    assert (cond["status"], cond["reason"]) == ("True", "AllPodsStarted")


def test_long_unschedulable_is_a_condition_after_a_minute() -> None:
    sim = _sim()
    sim.step()
    for p in sim.pods.values():
        p["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/16 nodes are available: 16 Insufficient nvidia.com/gpu.",
                "lastTransitionTime": format_time(sim.now),
            }
        ]
    out = sim.step()
    assert _condition(sim, "PodsScheduled")["reason"] == "Unschedulable"  # at once
    assert not any(c["type"] == "PodsStarted" for c in sim.status["conditions"])
    assert 59 < out.requeue_after <= 60.1  # woken when it turns long
    sim.tick(61)
    sim.step()
    cond = _condition(sim, "PodsStarted")
    assert cond["reason"] == "Unschedulable"
    assert "unschedulable for 61s: 0/16 nodes are available" in cond["message"]


def test_startup_timeout_releases_the_gpus_by_the_rules() -> None:
    sim = _sim(
        {"startupTimeoutSeconds": 120, "rules": [{"action": "Fail", "reasons": ["StartupTimeout"]}]}
    )
    sim.step()
    _schedule(sim, sim.now, ("ImagePullBackOff", 'Back-off pulling image "nope:1"'))
    sim.step()
    sim.tick(119)
    sim.step()
    assert sim.status["phase"] == "Pending"
    sim.tick(2)
    out = sim.step()
    st = sim.status
    assert st["phase"] == "Failed" and st["lastFailure"]["reason"] == "StartupTimeout"
    assert "ImagePullBackOff" in st["lastFailure"]["message"]
    assert "startupTimeoutSeconds" in st["lastFailure"]["message"]
    assert sorted(out.delete_pods) == sorted(sim.pods)  # every pod, none of them Failed to keep


def test_startup_timeout_restarts_by_default_and_counts() -> None:
    sim = _sim({"startupTimeoutSeconds": 60})
    sim.step()
    _schedule(sim, sim.now)  # scheduled, but never Running
    sim.tick(61)
    sim.step()
    st = sim.status
    assert (st["phase"], st["restartsCounted"]) == ("Restarting", 1)


def test_no_startup_timeout_while_nothing_is_scheduled_or_when_off() -> None:
    sim = _sim({"startupTimeoutSeconds": 60})
    sim.step()
    sim.tick(600)
    sim.step()
    assert sim.status["phase"] == "Pending"  # unscheduled pods hold no GPU
    off = _sim({"startupTimeoutSeconds": 0})
    off.step()
    _schedule(off, off.now)
    off.tick(100000)
    off.step()
    assert off.status["phase"] == "Pending"


def _sidecar_pod(trainer_exit: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-a0-0", "labels": {"megatron.dev/restart-attempt": "0"}},
        "spec": {"nodeName": "node-0"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": trainer_exit}}},
                {"name": "exporter", "state": {"running": {}}},
            ],
        },
    }


def test_a_trainer_that_exited_beside_a_running_sidecar_has_finished() -> None:
    done, failed = pod_view(_sidecar_pod(0)), pod_view(_sidecar_pod(3))
    assert done.succeeded and done.active  # its rank is done; the pod still holds its GPUs
    assert not failed.succeeded and failed.trainer_exited and failed.exit_code == 3


def test_the_job_succeeds_and_stops_pods_whose_sidecars_still_run() -> None:
    sim = _sim()
    sim.start_running()
    for name in sim.pods:
        sim.pods[name]["status"] = _sidecar_pod(0)["status"]
    sim.step()
    assert sim.status["phase"] == "Succeeded"
    out = sim.step()
    assert sorted(out.delete_pods) == sorted(sim.pods)  # the sidecars stop: GPUs released


def test_startup_problem_of_an_init_container_names_it() -> None:
    raw = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n"},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "fetch",
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}},
                }
            ],
        },
    }
    problem, _ = startup_problem(pod_view(raw), datetime(2026, 1, 1))
    assert problem is not None and problem.reason == "ErrImagePull"
    assert problem.message == "pod p on n: ErrImagePull: container fetch: not found"


def test_an_ordinary_wait_is_no_problem() -> None:
    raw = {
        "metadata": {"name": "p"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        },
    }
    assert startup_problem(pod_view(raw), datetime(2026, 1, 1)) == (None, None)


def test_pods_the_apiserver_refused_are_not_tried_again_until_the_spec_changes() -> None:
    from megatron_operator.core.reconcile import World, reconcile

    sim = _sim()
    sim.step()
    sim.pods.clear()  # the creates failed: the apiserver refused them (a 422)
    sim.job["status"].pop("launchedAttempt", None)
    world = World(
        job=sim.job, pods=[], now=sim.now, rejection='Pod "job-a0-0" is invalid: spec.volumes'
    )
    out = reconcile(world)
    sim.job["status"] = out.status
    assert out.status["phase"] == "Failed"
    created = next(c for c in out.status["conditions"] if c["type"] == "CreateFailure")
    assert created["status"] == "True" and "spec.volumes" in created["message"]
    for _ in range(3):  # later reconciles, the same spec: nothing is created again
        sim.tick(60)
        out = sim.step()
        assert out.create == [] and sim.status["phase"] == "Failed"
    assert (
        next(c for c in sim.status["conditions"] if c["type"] == "CreateFailure")["status"]
        == "True"
    )
    sim.job["metadata"]["generation"] = 2  # the spec changed: try again
    out = sim.step()
    assert sim.status["phase"] == "Pending" and out.create_pods


def _exited(sim: Sim, name: str, code: int, at: str, sidecar: bool = False) -> None:
    """The kubelet's first report of a container exit: the containers' states, while the pod's
    phase stays Running until the pod is torn down (seen on real kubelets under load)."""
    statuses: list[dict[str, Any]] = [
        {
            "name": "trainer",
            "state": {"terminated": {"exitCode": code, "reason": "Error", "finishedAt": at}},
        }
    ]
    if sidecar:
        statuses.append({"name": "log-shipper", "state": {"running": {}}})
    sim.pods[name]["status"] = {"phase": "Running", "containerStatuses": statuses}


def test_a_pod_whose_phase_has_not_yet_turned_failed_is_kept() -> None:
    sim = _sim({"keepFailedPods": 1})
    sim.start_running()
    _exited(sim, "job-a0-1", 1, "2026-11-26T06:00:00Z")
    out = sim.step()
    assert sim.status["keptPods"] == ["job-a0-1"]
    assert "job-a0-1" not in out.delete_pods and len(out.delete_pods) == 3
    sim.settle()
    sim.pods["job-a0-1"]["status"]["phase"] = "Failed"  # the kubelet is done with it
    sim.settle()
    sim.run_all()
    sim.step()
    assert sim.status["phase"] == "Running" and sim.status["keptPods"] == ["job-a0-1"]
    assert sim.pods["job-a0-1"]["status"]["phase"] == "Failed"


def test_a_failed_trainer_beside_a_running_sidecar_is_not_kept() -> None:
    # Kept, it would hold its node's GPUs for as long as the sidecar runs.
    sim = _sim({"keepFailedPods": 1})
    sim.start_running()
    _exited(sim, "job-a0-1", 1, "2026-11-26T06:00:00Z", sidecar=True)
    out = sim.step()
    assert sim.status["phase"] == "Restarting" and not sim.status.get("keptPods")
    assert "job-a0-1" in out.delete_pods


def test_of_two_pods_exited_with_the_same_code_the_earlier_is_blamed() -> None:
    # Rank 3 crashed; rank 0 lost its peer a second later with the same exit code.
    sim = _sim({"keepFailedPods": 1})
    sim.start_running()
    _exited(sim, "job-a0-0", 1, "2026-11-26T06:00:05Z")
    _exited(sim, "job-a0-3", 1, "2026-11-26T06:00:04Z")
    sim.step()
    assert sim.status["lastFailure"]["pod"] == "job-a0-3"
    assert sim.status["keptPods"] == ["job-a0-3"]
    report = next(m for r, m in sim.events if r == "AttemptFailed")
    assert report.startswith("attempt 0: 2 pod(s) failed: pod job-a0-3 ")


def test_a_succeeded_job_keeps_pods_whose_phase_has_not_yet_turned() -> None:
    # Seen on real kubelets: the job Succeeded on the containers' exits and deleted the pods
    # still shown Running, and with them the logs of the successful attempt.
    sim = _sim()
    sim.start_running()
    for p in sim.pods.values():
        p["status"] = {
            "phase": "Running",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ],
        }
    out = sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert not out.delete_pods and not out.force_delete
    out = sim.step()
    assert not out.delete_pods and len(sim.pods) == 4
