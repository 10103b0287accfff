"""The job state machine, driven through whole lifecycles in memory (pure, no cluster).

These cases run with `restartPolicy.strategy: Recreate`, the rung that recreates every pod;
tests/unit/test_ladder.py drives the lower rungs (in place, replacing one pod)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_operator.api.spec import RestartPolicySpec
from megatron_operator.core import churn
from megatron_operator.core.observe import format_time, parse_time
from megatron_operator.core.policy import MAX_UNCOUNTED_PER_HOUR
from megatron_operator.core.reconcile import Settings, World, reconcile

from .sim import T0, Sim
from .specs import DELETE, job_doc, spec_of


def _sim(changes: dict[str, Any] | None = None, nodes: int = 4) -> Sim:
    base = {"resources.nodes": nodes, "training.globalBatchSize": 8 * nodes * 4}
    spec = spec_of({**base, **(changes or {})})
    spec.setdefault("restartPolicy", {}).setdefault("strategy", "Recreate")
    doc = job_doc(spec, name="job")
    doc["metadata"].update(uid="uid-1", generation=1)
    return Sim(job=doc)


def _running(sim: Sim) -> None:
    sim.settle()
    sim.run_all()
    sim.step()


def test_create_then_running() -> None:
    sim = _sim()
    sim.step()
    assert sorted(sim.pods) == ["job-a0-0", "job-a0-1", "job-a0-2", "job-a0-3"]
    assert sim.status["phase"] == "Pending"
    assert sim.status["layout"] == "DP32"
    sim.step()
    assert sim.status["launchedAttempt"] == 0
    sim.run_all()
    sim.step()
    assert sim.status["phase"] == "Running"
    assert ("Running", "all 4 pods are running (attempt 0)") in sim.events
    assert sim.created == 4


def test_gang_restart_after_backoff() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 10, "maxBackoffSeconds": 60}})
    _running(sim)
    sim.fail("job-a0-2", exit_code=1)
    out = sim.step()
    st = sim.status
    assert (st["phase"], st["restarts"], st["restartsCounted"], st["restartAttempt"]) == (
        "Restarting",
        1,
        1,
        1,
    )
    # every pod of the attempt goes but the failed one, kept (Failed, holding nothing) for its
    # logs: restartPolicy.keepFailedPods is 1 by default
    assert sorted(out.delete_pods) == ["job-a0-0", "job-a0-1", "job-a0-3"]
    assert st["keptPods"] == ["job-a0-2"]
    assert st["lastFailure"]["pod"] == "job-a0-2" and st["lastFailure"]["exitCode"] == 1
    assert any(c["type"] == "Restarting" and c["status"] == "True" for c in st["conditions"])
    assert any(reason == "Restarting" for reason, _ in sim.events)
    sim.finish_deletions()
    assert list(sim.pods) == ["job-a0-2"]
    sim.step()  # all the others gone: the backoff starts now
    assert sim.status["restartAt"] == format_time(sim.now + timedelta(seconds=10))
    assert list(sim.pods) == ["job-a0-2"]
    sim.tick(9)
    sim.step()
    assert list(sim.pods) == ["job-a0-2"]
    sim.tick(2)
    sim.step()
    assert sim.attempts() == {"1"} and len(sim.pods) == 5
    assert sim.pods["job-a0-2"]["status"]["phase"] == "Failed"  # still there, after the restart
    assert sim.status["phase"] == "Pending"


def test_a_one_pod_gang_whose_failed_pod_is_kept_restarts_after_its_backoff() -> None:
    """Nothing is deleted (the failed pod is kept for its logs), so no pod event wakes the job:
    the decision itself asks for the next pass, which starts the backoff."""
    sim = _sim({"restartPolicy": {"backoffSeconds": 2, "maxBackoffSeconds": 4}}, nodes=1)
    _running(sim)
    sim.fail("job-a0-0", exit_code=1)
    out = sim.step()
    assert sim.status["phase"] == "Restarting" and not out.delete_pods
    assert out.requeue_after <= 0.1
    sim.step()
    assert sim.status["restartAt"] == format_time(sim.now + timedelta(seconds=2))
    sim.tick(2.1)
    sim.step()
    assert sim.attempts() == {"1"} and sim.status["phase"] == "Pending"


def test_max_restarts_fails_and_frees_every_gpu() -> None:
    sim = _sim({"restartPolicy": {"maxRestarts": 1, "backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    sim.fail("job-a0-0")
    sim.settle()
    sim.run_all()
    sim.step()
    assert sim.status["phase"] == "Running" and sim.attempts() == {"1"}
    sim.fail("job-a1-1")
    sim.settle()
    assert sim.status["phase"] == "Failed"
    # Only the last failed attempt's pod is left (keepFailedPods: 1), Failed: it holds nothing.
    assert list(sim.pods) == ["job-a1-1"] and sim.status["keptPods"] == ["job-a1-1"]
    assert sim.pods["job-a1-1"]["status"]["phase"] == "Failed"
    failed = next(c for c in sim.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "MaxRestartsExceeded"


def test_config_error_exit_code_fails_without_retry() -> None:
    sim = _sim()
    _running(sim)
    sim.fail("job-a0-1", exit_code=78)
    sim.settle()
    assert sim.status["phase"] == "Failed"
    assert sim.status["restarts"] == 0
    assert list(sim.pods) == ["job-a0-1"]  # kept for `kubectl logs`: why the config is bad


def test_disruption_restarts_without_counting() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    sim.disrupt("job-a0-3")
    sim.step()
    assert (sim.status["restarts"], sim.status["restartsCounted"]) == (1, 0)
    assert sim.status["lastFailure"]["reason"] == "DisruptionTarget"


def test_node_lost_after_grace() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    node = sim.pods["job-a0-1"]["spec"]["nodeName"]
    sim.not_ready[node] = sim.now
    out = sim.step()
    assert sim.status["phase"] == "Running"
    assert 29 < out.requeue_after <= 30.1  # woken up when the grace ends
    sim.tick(31)
    sim.step()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["lastFailure"]["reason"] == "NodeLost"
    assert sim.status["restartsCounted"] == 0


def test_a_pod_stranded_on_a_lost_node_is_force_deleted_then_the_gang_restarts() -> None:
    """A lost node's kubelet never confirms a delete: without a forced delete the next attempt
    would wait for that pod forever."""
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    node = sim.pods["job-a0-1"]["spec"]["nodeName"]
    uid = sim.pods["job-a0-1"]["metadata"]["uid"]
    sim.not_ready[node] = sim.now
    sim.tick(31)
    out = sim.step()  # NodeLost: every pod is deleted with its grace period first
    assert sim.status["phase"] == "Restarting"
    assert "job-a0-1" in out.delete_pods and out.force_delete == []
    for name in [n for n, p in sim.pods.items() if p["spec"]["nodeName"] != node]:
        del sim.pods[name]  # the healthy kubelets finish their deletes; the lost one cannot
    out = sim.step()
    assert out.force_delete == ["job-a0-1"] and out.delete_uids["job-a0-1"] == uid
    assert out.delete_pods == []
    assert any(r == "ForceDeleted" and node in m for r, m in sim.events)
    for _ in range(3):
        sim.tick(1)
        sim.step()
    assert sim.attempts() == {"1"} and len(sim.pods) == 4


def test_a_deleting_pod_is_not_forced_before_its_node_counts_as_lost() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    node = sim.pods["job-a0-2"]["spec"]["nodeName"]
    sim.fail("job-a0-0")
    sim.step()  # the gang restart: every pod is being deleted
    for name in [n for n in sim.pods if n != "job-a0-2"]:
        del sim.pods[name]
    sim.not_ready[node] = sim.now  # its node stops answering while the delete is pending
    sim.tick(10)
    out = sim.step()
    assert out.force_delete == [] and "job-a0-2" in sim.pods
    assert 19 < out.requeue_after <= 20.1  # woken when the node counts as lost
    sim.tick(21)
    out = sim.step()
    assert out.force_delete == ["job-a0-2"] and "job-a0-2" not in sim.pods


def test_hang_detection() -> None:
    sim = _sim({"restartPolicy": {"hangTimeoutSeconds": 60}})
    _running(sim)
    sim.tick(50)
    sim.report_progress(10)  # fresh
    sim.step()
    assert sim.status["phase"] == "Running"
    assert sim.status["progressSummary"] == "10/100 loss 2.5"
    sim.tick(59)
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.tick(2)
    sim.step()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["lastFailure"]["reason"] == "Hang"


def test_progress_written_by_the_last_pods_launcher_is_the_jobs() -> None:
    """Megatron-LM prints its loss on the last rank only: the launcher of the last pod writes
    the Lease, and the operator takes the record by its attempt, whoever holds the Lease."""
    sim = _sim({"restartPolicy": {"hangTimeoutSeconds": 60}})
    _running(sim)
    sim.tick(50)
    sim.report_progress(10)
    assert sim.lease is not None
    sim.lease["spec"]["holderIdentity"] = "job-a0-3"  # node rank 3 of 4: the last rank's pod
    sim.step()
    assert sim.status["progress"]["iteration"] == 10
    sim.tick(59)
    sim.step()
    assert sim.status["phase"] == "Running"  # its renewTime is the heartbeat too


def test_own_code_without_a_progress_source_is_never_judged_hung() -> None:
    own = {
        "trainer": {"command": ["python", "t.py"], "progress": "None"},
        "restartPolicy": {"hangTimeoutSeconds": 60},
        "model": DELETE,
        "training": DELETE,
        "data": DELETE,
    }
    sim = _sim(own)
    _running(sim)
    sim.tick(3600)
    sim.step()
    assert sim.status["phase"] == "Running" and "lastFailure" not in sim.status
    own["trainer"]["progress"] = "MegatronLog"  # a source that says nothing: a hang
    own["restartPolicy"]["firstStepTimeoutSeconds"] = 60
    sim = _sim(own)
    _running(sim)
    sim.tick(61)
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "Hang"


def test_stale_progress_annotation_hangs_after_timeout_from_running() -> None:
    sim = _sim({"restartPolicy": {"hangTimeoutSeconds": 30}})
    _running(sim)
    sim.report_progress(3, at=T0.replace(hour=1))  # hours old
    sim.tick(10)
    sim.step()
    assert sim.status["phase"] == "Running"  # measured from runningSince, not the stale time
    sim.tick(25)
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "Hang"


def test_success_and_ttl() -> None:
    sim = _sim({"ttlSecondsAfterFinished": 30})
    _running(sim)
    sim.succeed_all()
    out = sim.step()
    assert sim.status["phase"] == "Succeeded"
    assert out.delete_pods == []  # finished pods hold no GPU: kept for their logs
    assert 29 < out.requeue_after <= 30.1  # woken for the TTL, not at the next resync
    sim.tick(29)
    assert not sim.step().delete_job
    sim.tick(2)
    assert sim.step().delete_job


def test_suspend_and_resume() -> None:
    sim = _sim()
    _running(sim)
    sim.job["spec"]["suspend"] = True
    out = sim.step()
    assert sim.status["phase"] == "Suspended"
    assert len(out.delete_pods) == 4
    sim.finish_deletions()
    sim.step()
    sim.job["spec"]["suspend"] = False
    out = sim.step()
    assert sim.pods == {} and 0 < out.requeue_after <= 1.1  # the restart-loop floor
    sim.tick(1)
    sim.step()
    assert sim.attempts() == {"1"} and len(sim.pods) == 4
    assert sim.status["restarts"] == 0
    assert sim.status["phase"] == "Pending"


def test_suspend_toggles_count_toward_the_floor_and_the_backoff() -> None:
    """Toggling spec.suspend used to start a fresh gang at once each time (6 gangs in 5 s with
    maxRestarts 0): each resume now waits the floor, then the job's backoff."""
    sim = _sim({"restartPolicy": {"maxRestarts": 0, "backoffSeconds": 10}})
    _running(sim)
    gangs = {"0"}
    for _ in range(6):  # 6 toggles in about 5 s
        sim.job["spec"]["suspend"] = True
        sim.step()
        sim.finish_deletions()
        sim.step()
        sim.job["spec"]["suspend"] = False
        sim.step()
        sim.tick(0.8)
        sim.step()
        gangs |= sim.attempts()
    assert len(gangs) <= 3, gangs  # the first gang, and at most two resumes got pods
    st = sim.status
    assert len(st["resumeTimes"]) == 6 and len(st["attemptTimes"]) == 6
    assert st["restarts"] == 0 and st["phase"] == "Pending"
    waits = []
    for n in range(1, 7):  # how long the n-th resume of an hour waits
        assert churn.resume_seconds(RestartPolicySpec(), n, n - 1) >= 1.0
        waits.append(churn.resume_seconds(RestartPolicySpec(), n, n - 1))
    assert waits == [1.0, 10.0, 20.0, 40.0, 80.0, 160.0]


def test_the_operator_floor_spaces_fast_restart_loops() -> None:
    """backoffSeconds 0 and maxRestarts 10000 used to allow a gang a second for hours: past 5
    attempts an hour, the operator's floor doubles each time."""
    sim = _sim(
        {
            "restartPolicy": {
                "maxRestarts": 10000,
                "backoffSeconds": 0,
                "maxBackoffSeconds": 0,
                # No kept pod: the loop fails "the pod of rank 0", and a kept failed pod of an
                # earlier attempt would be found first (failing it again changes nothing).
                "keepFailedPods": 0,
            }
        }
    )
    _running(sim)
    waits = []
    for _ in range(9):
        sim.fail(next(n for n in sim.pods if n.endswith("-0")), exit_code=1)
        sim.step()
        sim.finish_deletions()
        sim.step()
        start = parse_time(sim.status["restartAt"])
        assert start is not None
        waits.append((start - sim.now).total_seconds())
        sim.now = start
        sim.step()
        sim.run_all()
        sim.step()
        assert sim.status["phase"] == "Running"
    assert waits == [1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert churn.floor_seconds(100) == churn.FLOOR_CAP_SECONDS


def test_invalid_spec_fails_and_a_fix_revives() -> None:
    sim = _sim({"parallelism.tensor": 3})
    sim.step()
    st = sim.status
    assert st["phase"] == "Failed"
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.parallelism.tensor" in failed["message"]
    assert sim.pods == {}
    events = len(sim.events)
    sim.step()
    assert len(sim.events) == events  # no event storm on every resync
    sim.job["spec"]["parallelism"]["tensor"] = 2
    sim.job["metadata"]["generation"] = 2
    sim.step()
    assert sim.status["phase"] == "Pending" and len(sim.pods) == 4


def test_operator_crash_while_creating_converges_to_one_attempt() -> None:
    sim = _sim(nodes=64, changes={"training.globalBatchSize": 512})
    sim.step(write_status=False, max_creates=17)  # killed after 17 creates, before the status
    sim.step(max_creates=30)
    sim.step()
    sim.step()
    assert len(sim.pods) == 64 and sim.created == 64
    assert sim.attempts() == {"0"}
    assert sim.status["launchedAttempt"] == 0 and sim.status["restarts"] == 0


def test_operator_crash_during_restart_counts_once() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    sim.fail("job-a0-0")
    sim.step()  # status written (restart recorded), but say the deletes were lost:
    for p in sim.pods.values():
        p["metadata"].pop("deletionTimestamp", None)
    sim.settle()
    assert sim.status["restarts"] == 1
    assert sim.attempts() == {"1"}


def test_deleted_pod_after_launch_restarts() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    del sim.pods["job-a0-2"]
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "PodDeleted"


def _any_json() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, 10**6),
        st.floats(allow_nan=True),
        st.text(max_size=8),
    )
    return st.recursive(
        leaf,
        lambda c: st.one_of(
            st.lists(c, max_size=3), st.dictionaries(st.text(max_size=12), c, max_size=4)
        ),
        max_leaves=12,
    )


SPEC_KEYS = [
    "image",
    "model",
    "parallelism",
    "training",
    "data",
    "resources",
    "checkpoint",
    "restartPolicy",
    "suspend",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.dictionaries(st.sampled_from(SPEC_KEYS), _any_json(), max_size=6),
    status=st.one_of(
        st.none(),
        _any_json(),
        st.dictionaries(
            st.sampled_from(["phase", "restarts", "conditions", "restartAttempt", "progress"]),
            _any_json(),
        ),
    ),
    base=st.booleans(),
)
def test_reconcile_never_raises(spec: dict[str, Any], status: Any, base: bool) -> None:
    doc = job_doc({**spec_of(), **spec} if base else spec)
    doc["metadata"]["uid"] = "u"
    doc["status"] = status
    out = reconcile(World(job=doc, pods=[], now=T0))
    json.dumps(out.status)  # always serialisable
    assert out.status.get("phase") in (
        "Failed",
        "Pending",
        "Running",
        "Restarting",
        "Suspended",
        "Succeeded",
        None,
    )


def test_a_spec_the_apiserver_rejects_fails_with_its_reason() -> None:
    from dataclasses import replace

    sim = _sim()
    world = replace(sim.world(), rejection='Pod "job-a0-0" is invalid: spec.nodeSelector: bad key')
    out = reconcile(world)
    assert out.status["phase"] == "Failed"
    failed = next(c for c in out.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "apiserver rejected" in failed["message"] and "nodeSelector" in failed["message"]
    assert out.create == []


# --- per-attempt pods, ownership, the restart floor, bad data (issue 15)


def test_each_attempt_has_new_pod_names_and_deletes_carry_uids() -> None:
    sim = _sim(
        {"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0, "keepFailedPods": 0}}
    )
    _running(sim)
    old = {n: p["metadata"]["uid"] for n, p in sim.pods.items()}
    sim.fail("job-a0-1")
    out = sim.step()
    assert sorted(out.delete_pods) == sorted(old)
    assert out.delete_uids == old  # each delete names the very pod observed
    sim.finish_deletions()
    for _ in range(4):
        sim.tick(1)
        sim.step()
    assert sorted(sim.pods) == ["job-a1-0", "job-a1-1", "job-a1-2", "job-a1-3"]
    hostnames = sorted(p["spec"]["hostname"] for p in sim.pods.values())
    assert hostnames == ["job-0", "job-1", "job-2", "job-3"]


def test_next_attempt_waits_for_live_pods_of_the_older_one() -> None:
    sim = _sim({"restartPolicy": {"backoffSeconds": 0, "maxBackoffSeconds": 0}})
    _running(sim)
    sim.job["spec"]["suspend"] = True
    sim.step()
    sim.job["spec"]["suspend"] = False
    out = sim.step()  # resumed, but attempt 0's pods still run (terminating): same hostnames
    assert out.create_pods == []
    sim.finish_deletions()
    sim.tick(1)  # the restart-loop floor
    sim.step()
    assert sim.attempts() == {"1"} and len(sim.pods) == 4


def _foreign_pod(name: str, owner_uid: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "uid": "foreign-uid",
        "labels": {
            "megatron.dev/job-name": "job",
            "megatron.dev/restart-attempt": "0",
            "megatron.dev/node-rank": "0",
        },
    }
    if owner_uid is not None:
        meta["ownerReferences"] = [{"kind": "X", "name": "x", "uid": owner_uid, "controller": True}]
    return {"metadata": meta, "spec": {}, "status": {"phase": "Running"}}


def test_a_foreign_pod_with_the_jobs_label_is_neither_counted_nor_deleted() -> None:
    for owner in (None, "someone-else"):
        sim = _sim()
        sim.pods["intruder"] = _foreign_pod("intruder", owner)
        out = sim.step()
        assert "intruder" not in out.delete_pods
        assert len(out.create_pods) == 4  # rank 0 is still missing: the intruder is not it
        sim.run_all()
        sim.step()
        sim.step()
        assert sim.status["phase"] == "Running"
        sim.job["spec"]["suspend"] = True
        out = sim.step()
        assert "intruder" not in out.delete_pods and len(out.delete_pods) == 4


def test_a_child_conflict_holds_the_job_with_a_condition_and_one_event() -> None:
    sim = _sim()
    conflict = "ConfigMap job-config already exists, with no controller, and is not this job's"
    for _ in range(3):
        out = reconcile(replace(sim.world(), conflict=conflict), sim.settings)
        sim.job["status"] = out.status
        sim.events += [(e.reason, e.message) for e in out.events]
        assert out.create == [] and out.requeue_after <= 15.1
    cond = next(c for c in sim.status["conditions"] if c["type"] == "ChildrenOwned")
    assert (cond["status"], cond["reason"]) == ("False", "ChildConflict")
    assert cond["message"].startswith("ConfigMap job-config")
    assert [r for r, _ in sim.events].count("ChildConflict") == 1
    assert "launchedAttempt" not in sim.status
    # the object went away: the next reconcile creates, and the condition clears once launched
    sim.settle()
    sim.run_all()
    sim.step()
    cond = next(c for c in sim.status["conditions"] if c["type"] == "ChildrenOwned")
    assert (cond["status"], cond["reason"]) == ("True", "ChildrenCreated")
    assert sim.status["phase"] == "Running"


def test_network_policy_only_when_the_operator_is_told() -> None:
    kinds = [o["kind"] for o in reconcile(_sim().world()).create]
    assert "NetworkPolicy" not in kinds
    sim = _sim()
    out = reconcile(sim.world(), Settings(network_policy=True))
    assert [o["kind"] for o in out.create].count("NetworkPolicy") == 1


def test_uncounted_restarts_are_recorded_and_count_past_the_cap() -> None:
    sim = _sim(
        {
            "restartPolicy": {
                "maxRestarts": 100,
                "backoffSeconds": 0,
                "maxBackoffSeconds": 0,
                # No kept pod: the loop fails "the pod of rank 0", and a kept failed pod of an
                # earlier attempt would be found first (failing it again changes nothing).
                "keepFailedPods": 0,
            }
        }
    )
    _running(sim)
    for i in range(MAX_UNCOUNTED_PER_HOUR + 1):
        rank0 = next(n for n in sim.pods if n.endswith("-0"))
        sim.disrupt(rank0)
        sim.step()
        sim.finish_deletions()
        sim.step()
        start = parse_time(sim.status["restartAt"])  # the backoff, or the operator's floor
        assert start is not None
        sim.now = start
        sim.step()
        sim.run_all()
        sim.step()
        assert sim.status["phase"] == "Running", i
    st = sim.status
    assert st["restarts"] == MAX_UNCOUNTED_PER_HOUR + 1
    assert st["restartsCounted"] == 1  # the 11th within the hour counted
    assert len(st["uncountedRestartTimes"]) == MAX_UNCOUNTED_PER_HOUR
    sim.tick(3600)  # an hour later the window is empty again
    rank0 = next(n for n in sim.pods if n.endswith("-0"))
    sim.disrupt(rank0)
    sim.step()
    assert sim.status["restartsCounted"] == 1
    assert len(sim.status["uncountedRestartTimes"]) == 1


@pytest.mark.parametrize(
    ("case", "break_it"),
    [
        # (A progress record stamped in year 9999 is not bad job data: the Lease's renewTime
        # that far ahead is ignored, test_observe_lease.py.)
        (
            "running since year 9999",
            lambda s: (
                s.job["spec"].setdefault("restartPolicy", {}).update(hangTimeoutSeconds=600),
                s.job["status"].update(runningSince="9999-12-31T23:59:59Z"),
            ),
        ),
        (
            "finished in year 9999 with a TTL",
            lambda s: (
                s.job["spec"].update(ttlSecondsAfterFinished=3600),
                s.job["status"].update(phase="Succeeded", completionTime="9999-12-31T23:59:59Z"),
            ),
        ),
    ],
)
def test_bad_job_data_fails_that_job_with_a_condition(case: str, break_it: Any) -> None:
    sim = _sim()
    _running(sim)
    break_it(sim)
    out = sim.step()  # must not raise
    st = sim.status
    assert st["phase"] == "Failed", case
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BadJobData" and "cannot process" in failed["message"]
    assert [e.reason for e in out.events] == ["BadJobData"]
    assert len(out.delete_pods) == 4  # nothing holds a GPU unwatched
    again = sim.step()
    assert again.events == []  # said once, not every reconcile


def test_a_job_in_the_operators_own_namespace_is_refused() -> None:
    """The operator's namespace holds its keys (the claim seal, the metrics TLS key), which a
    job's pods could mount: a job there fails at once, naming the field, and nothing is made."""
    from .sim import Sim

    sim = Sim.of_spec(spec_of())
    sim.settings = Settings(own_namespace="default")  # job_doc's namespace
    out = sim.step()
    failed = next(c for c in sim.status["conditions"] if c["type"] == "Failed")
    assert sim.status["phase"] == "Failed" and failed["reason"] == "InvalidSpec"
    assert failed["message"].startswith("metadata.namespace: default is the operator's own")
    assert out.create == [] and out.create_pods == [] and sim.pods == {}
    sim.settings = Settings(own_namespace="megatron-system")  # elsewhere: planned as usual
    sim.job["metadata"]["generation"] = 2
    sim.step()
    assert sim.status["phase"] != "Failed" and sim.pods
