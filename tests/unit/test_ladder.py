"""The restart ladder through the pure state machine: which rung recovers which failure, how it
escalates, and that every rung is counted once, by the same rules (no cluster).

`Sim` plays the kubelet (pod phases) and the launchers' coordinator (its report in the progress
Lease, `Sim.report_launchers`); the operator's side is the real `reconcile`.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_operator.cluster.ratelimit import PROGRESS_COPY_SECONDS
from megatron_operator.core.ladder import partition
from megatron_operator.core.observe import format_time, pod_view
from megatron_operator.core.reconcile import reconcile

from .sim import Sim
from .specs import spec_of

PODS = ["job-a0-0", "job-a0-1", "job-a0-2", "job-a0-3"]


def _sim(policy: dict[str, Any] | None = None, nodes: int = 4) -> Sim:
    changes = {"resources.nodes": nodes, "training.globalBatchSize": 8 * nodes * 4}
    spec = spec_of(changes)
    # keepFailedPods 0: the rungs' pod deletes in full (the kept failed pod of a recreated gang
    # is tests/unit/test_evidence.py's).
    spec["restartPolicy"] = {
        "backoffSeconds": 1,
        "maxBackoffSeconds": 1,
        "keepFailedPods": 0,
        **(policy or {}),
    }
    return Sim.of_spec(spec)


def _uids(sim: Sim) -> dict[str, str]:
    return {n: p["metadata"]["uid"] for n, p in sim.pods.items()}


def _released(sim: Sim) -> None:
    """Let the backoff pass (and deletions finish) until the restart is released, then let the
    kubelet run whatever was created."""
    for _ in range(10):
        sim.step()
        sim.finish_deletions()
        if sim.status["phase"] != "Restarting":
            break
        sim.tick(1)
    assert sim.status["phase"] != "Restarting", sim.status
    sim.run_all()
    sim.step()
    assert sim.status["phase"] == "Running", sim.status


def _stepped(sim: Sim, iteration: int = 1) -> None:
    """Rank 0 of the current attempt reports a training step."""
    sim.report_progress(iteration)
    sim.step()
    assert sim.status["progress"]["attempt"] == sim.status["restartAttempt"]


def test_a_rank_failure_restarts_every_rank_in_place() -> None:
    sim = _sim()
    sim.start_running()
    before = _uids(sim)
    sim.report_launchers(failures=[(2, 1)])  # a rank of pod 2 exited 1; its pod runs on
    out = sim.step()
    st = sim.status
    assert (st["phase"], st["restarts"], st["restartsCounted"], st["restartAttempt"]) == (
        "Restarting",
        1,
        1,
        1,
    )
    assert st["gangAttempt"] == 0
    assert st["lastFailure"]["rung"] == "InPlace"
    assert st["lastFailure"]["exitCode"] == 1 and st["lastFailure"]["pod"] == "job-a0-2"
    assert out.restart_rung == "InPlace" and out.restart_reason == "Error"
    assert not out.delete_pods and not out.create
    # Nothing it deletes will wake it: the backoff starts at the decision, and the release is
    # due when it ends.
    assert st["restartAt"] == format_time(sim.now + timedelta(seconds=1))
    assert out.requeue_after == pytest.approx(1.05)
    assert any("restarting every rank in place as attempt 1" in m for _, m in sim.events)
    _released(sim)
    # Nothing was deleted or created: the same pods run attempt 1.
    assert _uids(sim) == before and sim.created == 4
    assert sim.status["restartAttempt"] == 1 and sim.status["launchedAttempt"] == 1
    _stepped(sim)


def test_a_lost_pod_is_replaced_alone_with_the_same_hostname() -> None:
    sim = _sim()
    sim.start_running()
    before = _uids(sim)
    sim.fail("job-a0-1", exit_code=137)  # its container was killed
    out = sim.step()
    assert sim.status["lastFailure"]["rung"] == "ReplacePod"
    assert out.delete_pods == ["job-a0-1"]
    _released(sim)
    assert sorted(sim.pods) == sorted(["job-a0-0", "job-a1-1", "job-a0-2", "job-a0-3"])
    kept = {n: u for n, u in before.items() if n != "job-a0-1"}
    assert {n: u for n, u in _uids(sim).items() if n in kept} == kept
    new = sim.pods["job-a1-1"]
    assert new["spec"]["hostname"] == "job-1" and new["spec"]["subdomain"] == "job"
    assert (sim.status["restarts"], sim.status["restartAttempt"]) == (1, 1)
    assert sim.status["gangAttempt"] == 0


def test_the_kubelet_reporting_a_killed_container_late_is_the_same_restart() -> None:
    """The container of pod 1 dies: its launcher's connection drops at once, the ranks of the
    other pods fail, and the kubelet says Failed seconds later. One restart, one pod replaced."""
    sim = _sim()
    sim.start_running()
    before = _uids(sim)
    sim.report_launchers(failures=[(0, 1)])  # the survivors' ranks fail first...
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "InPlace"
    sim.report_launchers(failures=[(0, 1)], lost=["job-a0-1"], attempt=0)  # ...then the drop
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "ReplacePod"
    assert sim.pods["job-a0-1"]["metadata"].get("deletionTimestamp")
    sim.fail("job-a0-1", exit_code=137)  # the kubelet, late
    _released(sim)
    assert sim.status["restarts"] == 1
    assert before["job-a0-0"] == _uids(sim)["job-a0-0"]
    assert sorted(sim.pods) == sorted(["job-a0-0", "job-a1-1", "job-a0-2", "job-a0-3"])


def test_a_launcher_dropping_out_of_a_running_pod_replaces_that_pod() -> None:
    sim = _sim()
    sim.start_running()
    sim.report_launchers(lost=["job-a0-3"])
    sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"], failure["pod"]) == (
        "LauncherLost",
        "ReplacePod",
        "job-a0-3",
    )


def test_losing_the_rendezvous_host_recreates_the_gang() -> None:
    sim = _sim()
    sim.start_running()
    sim.fail("job-a0-0", exit_code=137)
    out = sim.step()
    failure = sim.status["lastFailure"]
    assert failure["rung"] == "Recreate" and "node rank 0" in failure["rungReason"]
    assert sorted(out.delete_pods) == PODS
    _released(sim)
    assert sim.attempts() == {"1"} and "gangAttempt" not in sim.status


def test_the_host_lost_during_an_in_place_restart_recreates_within_that_restart() -> None:
    sim = _sim()
    sim.start_running()
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "InPlace"
    sim.fail("job-a0-0", exit_code=137)
    out = sim.step()
    assert sim.status["lastFailure"]["rung"] == "Recreate"
    assert sorted(out.delete_pods) == PODS
    _released(sim)
    assert sim.status["restarts"] == 1 and sim.attempts() == {"1"}


def test_an_in_place_attempt_failing_before_its_first_step_escalates_to_recreate() -> None:
    sim = _sim()
    sim.start_running()
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    _released(sim)
    sim.report_launchers(failures=[(2, 1)])  # attempt 1 fails again, no step reported
    out = sim.step()
    failure = sim.status["lastFailure"]
    assert (
        failure["rung"] == "Recreate" and "before its first training step" in failure["rungReason"]
    )
    assert sorted(out.delete_pods) == PODS
    assert sim.status["restarts"] == 2


def test_an_in_place_attempt_that_stepped_fails_in_place_again() -> None:
    sim = _sim()
    sim.start_running()
    for attempt in range(1, 4):
        sim.report_launchers(failures=[(attempt, 1)])  # a different pod's rank each time
        sim.step()
        assert sim.status["lastFailure"]["rung"] == "InPlace"
        _released(sim)
        _stepped(sim, attempt * 10)
        assert sim.status["restartAttempt"] == attempt and sim.attempts() == {"0"}


def test_a_node_failing_twice_escalates_to_recreate() -> None:
    sim = _sim()
    sim.start_running()
    node = sim.pods["job-a0-2"]["spec"]["nodeName"]
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    assert sim.status["failedNodes"] == [node]
    _released(sim)
    _stepped(sim)
    sim.report_launchers(failures=[(1, 1)])  # another node: still in place
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "InPlace"
    _released(sim)
    _stepped(sim)
    sim.report_launchers(failures=[(2, 1)])  # the first node again
    sim.step()
    failure = sim.status["lastFailure"]
    assert (
        failure["rung"] == "Recreate"
        and f"node {node} failed a second time" in (failure["rungReason"])
    )
    assert "failedNodes" not in sim.status  # a new gang starts with a clean record
    _released(sim)
    assert sim.attempts() == {"3"}


def test_a_node_failing_again_stays_in_place_when_the_policy_says_so() -> None:
    sim = _sim({"recreateOnRepeatedNodeFailure": False})
    sim.start_running()
    node = sim.pods["job-a0-2"]["spec"]["nodeName"]
    for attempt in range(1, 4):
        sim.report_launchers(failures=[(2, 1)])  # the same node every time
        sim.step()
        assert sim.status["lastFailure"]["rung"] == "InPlace", sim.status["lastFailure"]
        assert sim.status["failedNodes"] == [node]
        _released(sim)
        _stepped(sim, attempt * 10)
        assert sim.status["restartAttempt"] == attempt and sim.attempts() == {"0"}


def test_in_place_restarts_wait_their_backoff_only_not_the_floor_over_new_gangs() -> None:
    """The operator's floor (core/churn.py) doubles past 5 new gangs an hour; in-place restarts
    make no gang, so the tenth of an hour is released after the job's 1 s backoff too."""
    sim = _sim({"maxRestarts": 20, "recreateOnRepeatedNodeFailure": False})
    sim.start_running()
    for attempt in range(1, 11):
        sim.report_launchers(failures=[(attempt % 4, 1)])
        sim.step()
        assert sim.status["lastFailure"]["rung"] == "InPlace"
        sim.tick(1.1)
        sim.step()
        assert sim.status["phase"] != "Restarting", (attempt, sim.status.get("restartAt"))
        _released(sim)
        _stepped(sim, attempt * 10)
    assert sim.attempts() == {"0"} and "attemptTimes" not in sim.status
    # A recreate (an attempt failing before its first step) makes a new gang: it counts.
    sim.report_launchers(failures=[(1, 1)])
    sim.step()
    _released(sim)
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "Recreate"
    assert len(sim.status["attemptTimes"]) == 1


def test_an_in_place_restart_that_reaches_no_step_in_time_recreates() -> None:
    sim = _sim({"inPlaceTimeoutSeconds": 60})
    sim.start_running()
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    _released(sim)
    sim.tick(59)
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.tick(2)
    out = sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"]) == ("RestartTimeout", "Recreate")
    assert sorted(out.delete_pods) == PODS
    assert sim.status["restarts"] == 2


@pytest.mark.parametrize("code", [78, 17])
def test_a_non_retryable_exit_code_fails_the_job_at_once(code: int) -> None:
    sim = _sim()
    sim.start_running()
    sim.report_launchers(failures=[(1, code)])
    out = sim.step()
    st = sim.status
    assert st["phase"] == "Failed" and st.get("restarts", 0) == 0
    assert st["lastFailure"]["exitCode"] == code and st["lastFailure"]["action"] == "Fail"
    assert "rung" not in st["lastFailure"]
    assert sorted(out.delete_pods) == PODS  # nothing may hold a GPU after the end


def test_max_restarts_counts_every_rung() -> None:
    sim = _sim({"maxRestarts": 3})
    sim.start_running()
    rungs = []
    sim.report_launchers(failures=[(1, 1)])  # 1: in place
    sim.step()
    rungs.append(sim.status["lastFailure"]["rung"])
    _released(sim)
    _stepped(sim)
    sim.fail("job-a0-2", exit_code=137)  # 2: a pod replaced
    sim.step()
    rungs.append(sim.status["lastFailure"]["rung"])
    _released(sim)
    _stepped(sim)
    sim.fail("job-a0-0", exit_code=137)  # 3: the gang recreated (node rank 0)
    sim.step()
    rungs.append(sim.status["lastFailure"]["rung"])
    _released(sim)
    assert rungs == ["InPlace", "ReplacePod", "Recreate"]
    assert (sim.status["restarts"], sim.status["restartsCounted"]) == (3, 3)
    sim.report_launchers(failures=[(1, 1)])  # the 4th counted restart is one too many
    out = sim.step()
    assert sim.status["phase"] == "Failed"
    assert sim.status["conditions"][-1]["reason"] == "MaxRestartsExceeded" or any(
        c["type"] == "Failed" and c["reason"] == "MaxRestartsExceeded"
        for c in sim.status["conditions"]
    )
    assert sorted(out.delete_pods) == ["job-a3-0", "job-a3-1", "job-a3-2", "job-a3-3"]


def test_uncounted_rules_hold_in_place_too() -> None:
    """A rank that exits 143 (it checkpointed on SIGTERM) is restarted in place, not counted."""
    sim = _sim({"maxRestarts": 0})
    sim.start_running()
    sim.report_launchers(failures=[(1, 143)])
    sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["action"], failure["rung"]) == ("RestartNotCounted", "InPlace")
    assert (sim.status["restarts"], sim.status["restartsCounted"]) == (1, 0)


def test_strategy_recreate_recreates_on_a_rank_failure() -> None:
    sim = _sim({"strategy": "Recreate"})
    sim.start_running()
    sim.report_launchers(failures=[(1, 1)])
    out = sim.step()
    assert sim.status["lastFailure"]["rung"] == "Recreate"
    assert sorted(out.delete_pods) == PODS


def test_a_hang_restarts_in_place() -> None:
    sim = _sim({"hangTimeoutSeconds": 30})
    sim.start_running()
    _stepped(sim, 5)
    sim.tick(31)
    out = sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"]) == ("Hang", "InPlace")
    assert not out.delete_pods
    assert "failedNodes" not in sim.status  # a hang says nothing about rank 0's node


def test_a_new_gang_is_held_to_the_first_step_timeout_until_its_first_step() -> None:
    """A new gang imports, rendezvouses and loads its checkpoint before its first step: a
    hangTimeoutSeconds right for a step (30 s) restarted healthy gangs under load. Until the
    first step the larger of firstStepTimeoutSeconds and hangTimeoutSeconds holds it."""
    sim = _sim({"hangTimeoutSeconds": 30, "firstStepTimeoutSeconds": 120})
    sim.start_running()
    sim.tick(119)  # four times the hang timeout, no step yet
    sim.step()
    assert sim.status["phase"] == "Running" and sim.status["restarts"] == 0
    sim.tick(2)
    sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"]) == ("Hang", "InPlace")
    assert "no training step 121s after the pods ran" in failure["message"], failure
    assert "firstStepTimeoutSeconds 120" in failure["message"]
    # A hang timeout longer than the first step's: the longer one holds the first step too.
    sim = _sim({"hangTimeoutSeconds": 300, "firstStepTimeoutSeconds": 120})
    sim.start_running()
    sim.tick(299)
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.tick(2)
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "Hang"
    # After the first step, the hang timeout alone.
    sim = _sim({"hangTimeoutSeconds": 30, "firstStepTimeoutSeconds": 120})
    sim.start_running()
    sim.tick(100)
    _stepped(sim, 1)
    sim.tick(31)
    sim.step()
    assert "no progress for 31s (hangTimeoutSeconds 30)" in sim.status["lastFailure"]["message"]


def test_an_in_place_attempt_is_held_to_its_own_timeout_until_its_first_step() -> None:
    """Its ranks import, rendezvous and restore before their first step: a hangTimeoutSeconds
    shorter than that (under load) restarted the attempt again and again. Until the first step
    inPlaceTimeoutSeconds holds it; from then on the hang rule does."""
    sim = _sim({"hangTimeoutSeconds": 30, "inPlaceTimeoutSeconds": 90})
    sim.start_running()
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    _released(sim)
    sim.tick(60)  # twice the hang timeout, no step yet
    sim.step()
    assert sim.status["phase"] == "Running" and sim.status["restarts"] == 1
    _stepped(sim, 5)
    sim.tick(31)  # then no progress for the hang timeout
    sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"]) == ("Hang", "InPlace")
    assert sim.status["restarts"] == 2
    _released(sim)
    sim.tick(91)  # this attempt never steps: its own timeout, and a recreate
    sim.step()
    failure = sim.status["lastFailure"]
    assert (failure["reason"], failure["rung"]) == ("RestartTimeout", "Recreate")


def test_operator_restart_mid_in_place_restart_makes_no_duplicate() -> None:
    """The operator dies at every point of an in-place restart; a fresh one (a reconcile from
    the stored status and the same report) never counts it again or restarts twice."""
    sim = _sim()
    sim.start_running()
    sim.report_launchers(failures=[(2, 1)])
    # Killed before its status write: nothing happened, the next one decides.
    sim.step(write_status=False)
    assert sim.status.get("restarts", 0) == 0
    sim.step()  # decided: restart 1, attempt 1 (the report still names attempt 0)
    decided = copy.deepcopy(sim.status)
    for _ in range(3):  # killed and restarted over and over before the release
        sim.step()
        assert sim.status["restarts"] == 1 and sim.status["restartAttempt"] == 1
    _released(sim)
    assert decided["restartAttempt"] == sim.status["restartAttempt"] == 1
    # After the release, the old report (attempt 0) is no failure of attempt 1.
    for _ in range(3):
        sim.step()
        assert sim.status["restarts"] == 1 and sim.status["phase"] == "Running"
    assert sim.created == 4


def test_a_report_names_only_this_gangs_pods() -> None:
    """The report is the tenant's to write: an older attempt's failures, and pods that are not
    the gang's current pods, are ignored."""
    sim = _sim()
    sim.start_running()
    sim.report_launchers(failures=[(1, 1)], attempt=7)  # not this attempt
    sim.step()
    assert sim.status["phase"] == "Running"
    lease = sim.lease
    assert lease is not None
    sim.report_launchers()
    annotations = lease["metadata"]["annotations"]
    text = annotations["megatron.dev/launchers"]
    annotations["megatron.dev/launchers"] = text.replace(
        '"lost":[]', '"lost":[{"nodeRank":0,"pod":"someone-elses-pod","time":"t"}]'
    )
    sim.step()
    assert sim.status["phase"] == "Running" and not sim.last.delete_pods  # type: ignore[union-attr]
    for garbage in ("{", "[]", '{"attempt": "0"}', "x" * 20000, "[" * 10000):
        annotations["megatron.dev/launchers"] = garbage
        sim.step()
        assert sim.status["phase"] == "Running"


def test_the_gang_is_the_newest_pod_of_each_rank_between_the_gang_and_the_current_attempt() -> None:
    sim = _sim()
    sim.start_running()
    views = [pod_view(p) for p in sim.pods.values()]
    current, stale = partition(views, gang=0, attempt=2, nodes=4)
    assert [x.name for x in current] == PODS and not stale
    current, stale = partition(views, gang=1, attempt=2, nodes=4)
    assert not current and len(stale) == 4
    current, stale = partition(views, gang=0, attempt=2, nodes=2)  # resized smaller
    assert [x.name for x in current] == PODS[:2] and len(stale) == 2
    replaced = copy.deepcopy(sim.pods["job-a0-1"])
    replaced["metadata"]["name"] = "job-a2-1"
    replaced["metadata"]["labels"]["megatron.dev/restart-attempt"] = "2"
    current, stale = partition([*views, pod_view(replaced)], gang=0, attempt=2, nodes=4)
    assert [x.name for x in current] == ["job-a0-0", "job-a2-1", "job-a0-2", "job-a0-3"]
    assert [x.name for x in stale] == ["job-a0-1"]


def test_reconcile_of_a_status_from_before_the_ladder_keeps_its_pods() -> None:
    """A job the previous operator version ran (no gangAttempt, no rung) goes on as it was."""
    sim = _sim()
    sim.start_running()
    status = sim.job["status"]
    status.pop("gangAttempt", None)
    out = reconcile(sim.world(), sim.settings)
    assert out.status["phase"] == "Running" and not out.delete_pods and not out.create


# --- any sequence of failures -------------------------------------------------------------------
ACTIONS = st.sampled_from(
    ["rank", "rank-fatal", "pod", "container", "host", "progress", "tick", "kubelet", "crash"]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ACTIONS, st.integers(0, 3)), max_size=30))
def test_any_sequence_of_failures_counts_each_restart_once_and_never_doubles_a_pod(
    events: list[tuple[str, int]],
) -> None:
    """Rank failures, lost pods and containers, progress, time and operator crashes in any
    order. Each restart is counted once (one `Restarting` decision event each, restartAttempt
    moving with it), a pod is only created for a node rank that has none left, an in-place
    decision deletes nothing, and whatever the last decision, the job settles."""
    sim = _sim({"maxRestarts": 100})
    sim.start_running()
    decisions = 0
    for action, node in events:
        if sim.status["phase"] in ("Failed", "Succeeded"):
            break
        current = sorted(
            n
            for n, p in sim.pods.items()
            if p["metadata"]["labels"]["megatron.dev/node-rank"] == str(node)
        )
        name = current[-1] if current else None
        crash = False
        if action == "rank":
            sim.report_launchers(failures=[(node, 1)])
        elif action == "rank-fatal":
            sim.report_launchers(failures=[(node, 78)])
        elif action in ("pod", "host") and name is not None:
            target = (
                name
                if action == "pod"
                else sorted(n for n, p in sim.pods.items() if n.endswith("-0"))[-1]
            )
            if sim.pods[target]["status"].get("phase") == "Running":
                sim.fail(target, exit_code=137)
        elif action == "container" and name is not None:
            sim.report_launchers(lost=[name])
        elif action == "progress":
            sim.report_progress(10)
        elif action == "tick":
            sim.tick(1)
        elif action == "kubelet":
            sim.finish_deletions()
            sim.run_all()
        elif action == "crash":
            crash = True
        before = dict(sim.status)
        ranks_alive = {p["metadata"]["labels"]["megatron.dev/node-rank"] for p in sim.pods.values()}
        out = reconcile(sim.world(), sim.settings) if crash else sim.step()
        for created in out.create_pods:
            rank = created["metadata"]["labels"]["megatron.dev/node-rank"]
            assert crash or rank not in ranks_alive, f"two pods of node rank {rank}"
        after = sim.status
        if after.get("restarts", 0) > before.get("restarts", 0):
            assert after["restarts"] == before.get("restarts", 0) + 1
            assert after["restartAttempt"] == before.get("restartAttempt", 0) + 1
            decisions += 1
            if not crash and after["lastFailure"]["rung"] == "InPlace":
                assert not out.delete_pods and not out.force_delete
        assert after.get("restartAttempt", 0) >= before.get("restartAttempt", 0)
    assert sim.status.get("restarts", 0) == decisions
    made = [m for r, m in sim.events if r == "Restarting" and ": " in m and "rule" in m]
    assert len(made) == decisions, made
    if sim.status["phase"] not in ("Failed", "Succeeded"):
        sim.report_launchers()  # the coordinator's report of a new attempt: nothing failed
        for _ in range(8):  # nothing more fails: it runs again
            sim.step()
            sim.finish_deletions()
            sim.run_all()
            sim.tick(1)
        assert sim.status["phase"] == "Running", sim.status
        live = [p for p in sim.pods.values() if not p["metadata"].get("deletionTimestamp")]
        ranks = sorted(p["metadata"]["labels"]["megatron.dev/node-rank"] for p in live)
        assert ranks == ["0", "1", "2", "3"], ranks


@pytest.mark.parametrize("made_by", ["Recreate", "an older operator"])
def test_pods_whose_launchers_cannot_restart_in_place_are_recreated(made_by: str) -> None:
    """The strategy the pods were created with decides, not the spec's now: a launcher of a
    Recreate pod (or of an older operator's) exits at the first failed rank and runs no
    coordinator, so switching the spec to InPlace cannot restart them in place."""
    sim = _sim({"strategy": "Recreate"} if made_by == "Recreate" else None)
    sim.start_running()
    if made_by == "Recreate":
        sim.job["spec"]["restartPolicy"]["strategy"] = "InPlace"  # changed while running
    else:
        for pod in sim.pods.values():
            del pod["metadata"]["annotations"]["megatron.dev/restart-strategy"]
    sim.report_launchers(failures=[(1, 1)])
    out = sim.step()
    failure = sim.status["lastFailure"]
    assert failure["rung"] == "Recreate" and "created to be recreated" in failure["rungReason"]
    assert sorted(out.delete_pods) == PODS
    _released(sim)
    assert sim.attempts() == {"1"}
    if made_by == "Recreate":  # the new gang's pods are InPlace ones: next time, in place
        assert all(
            p["metadata"]["annotations"]["megatron.dev/restart-strategy"] == "InPlace"
            for p in sim.pods.values()
        )
        _stepped(sim)
        sim.report_launchers(failures=[(1, 1)])
        sim.step()
        assert sim.status["lastFailure"]["rung"] == "InPlace"


def test_a_restarts_first_step_is_seen_inside_the_progress_copy_limit() -> None:
    """The progress copy into the status is rate-limited per job, but an attempt's first record
    is copied at once: a failure right after the in-place attempt's first step restarts in place
    again, not as an attempt that never trained (a Recreate)."""
    sim = _sim()
    sim.start_running()
    _stepped(sim, 5)
    sim.report_launchers(failures=[(1, 1)])
    sim.step()
    _released(sim)
    sim.report_progress(6)  # attempt 1's first step, inside the copy window of attempt 0's
    hold = sim.now + timedelta(seconds=PROGRESS_COPY_SECONDS)
    out = reconcile(replace(sim.world(), progress_not_before=hold), sim.settings)
    assert out.status["progress"]["attempt"] == 1
    sim.job["status"] = copy.deepcopy(out.status)
    sim.report_launchers(failures=[(2, 1)])
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "InPlace", sim.status["lastFailure"]
