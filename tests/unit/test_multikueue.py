"""MultiKueue through the pure state machines: the manager's side (core/multikueue.py) and the
worker's (the prebuilt Workload in core/queueing.py).

The tests play MultiKueue by hand, with the JSON Kueue v0.19 writes: it marks the manager's
Workload dispatched (`status.clusterName`, the admission check Ready), mirrors the worker's job
status onto the manager's job, and on the worker makes the Workload copy before the job copy
(`kueue.x-k8s.io/prebuilt-workload-name`). tests/integration/test_multikueue.py runs the same
story against the real Kueue controllers of a manager and two worker clusters.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from megatron_operator.api import load_job
from megatron_operator.api.managedby import MULTIKUEUE, OPERATOR, Manager, manager_of
from megatron_operator.core import kueue
from megatron_operator.core.kueue import WorkloadPhase
from megatron_operator.core.multikueue import NO_LABEL, dispatched, reconcile_dispatched
from megatron_operator.core.planner import plan
from megatron_operator.core.reconcile import Outcome, World

from .specs import job_doc, job_of, spec_of
from .test_kueue import cond
from .test_queueing import QueueSim, queued


def test_managed_by_values() -> None:
    assert manager_of(None) is Manager.OPERATOR
    assert manager_of(OPERATOR) is Manager.OPERATOR
    assert manager_of(MULTIKUEUE) is Manager.MULTIKUEUE
    assert manager_of("example.com/other") is Manager.OTHER


# --- the manager ---------------------------------------------------------------------------


@dataclass
class ManagerSim(QueueSim):
    """The manager's operator: reconcile_dispatched, and the shell's writes."""

    def step(self, **_: Any) -> Outcome:
        out = reconcile_dispatched(self.world(), self.settings)
        self.last = out
        self.job["status"] = copy.deepcopy(out.status)
        self.events += [(e.reason, e.message) for e in out.events]
        actions = out.workload
        if actions is not None:
            if actions.delete:
                self.workload = None
            if actions.create:
                self.workload = copy.deepcopy(actions.create)
                self.workload["metadata"]["resourceVersion"] = "1"
                self.workload["status"] = {}
            if actions.reset:
                assert self.workload is not None
                patch = kueue.eviction_reset_patch(self.workload, self.now)
                self.workload["status"].update(patch["status"])
                self.workload["status"].pop("admission")
                self.resets += 1
            for c in actions.conditions:
                self.applied.append(c)
                self._set(c)
        return out

    # --- playing MultiKueue and the worker
    def dispatch(self, worker: str = "worker-2") -> None:
        """The worker admitted its copy: MultiKueue marks the check Ready, names the worker,
        and Kueue admits the manager's Workload."""
        assert self.workload is not None
        self.workload["status"]["clusterName"] = worker
        self.admit()

    def mirror(self, status: dict[str, Any]) -> None:
        """MultiKueue copies the worker's job status here, whole."""
        self.job["status"] = copy.deepcopy(status)


def mk_job(changes: dict[str, Any] | None = None, queue: str | None = "gpus") -> ManagerSim:
    doc = job_doc(spec_of({"managedBy": MULTIKUEUE, **(changes or {})}), name="job")
    labels = {kueue.LABEL_QUEUE_NAME: queue} if queue else {}
    doc["metadata"].update(uid="uid-m", generation=1, labels=labels)
    return ManagerSim(job=doc)


WORKER_STATUS: dict[str, Any] = {
    "phase": "Running",
    "restarts": 1,
    "restartsCounted": 1,
    "restartAttempt": 1,
    "progress": {"iteration": 120},
    "progressSummary": "120/1000",
    "workload": "x",
    "conditions": [{"type": "Running", "status": "True", "reason": "AllPodsRunning"}],
}


def test_manager_creates_the_workload_and_nothing_else() -> None:
    sim = mk_job()
    out = sim.step()
    assert out.create == [] and out.delete_pods == [] and sim.pods == {}
    assert sim.workload is not None and sim.workload["spec"]["queueName"] == "gpus"
    assert sim.workload["spec"]["podSets"][0]["count"] == 2
    refs = sim.workload["metadata"]["ownerReferences"]
    assert [(r["kind"], r["uid"], r["controller"]) for r in refs] == [
        ("MegatronJob", "uid-m", True)
    ], "MultiKueue finds the adapter through the Workload's controller ownerReference"
    st = sim.status
    assert st["phase"] == "Queued" and st["workload"] == sim.name and st["gpus"] == 16
    assert "startTime" not in st


def test_manager_shows_kueues_message_until_dispatched() -> None:
    sim = mk_job()
    sim.step()
    sim.pend("couldn't assign flavors: insufficient quota")
    sim.step()
    admitted = next(c for c in sim.status["conditions"] if c["type"] == "Admitted")
    assert admitted["message"] == "couldn't assign flavors: insufficient quota"
    assert sim.applied == [], "no PodsReady before the job runs anywhere"


def test_manager_never_writes_the_status_once_dispatched() -> None:
    sim = mk_job()
    sim.step()
    sim.dispatch()
    assert dispatched(sim.workload or {})
    sim.mirror(WORKER_STATUS)
    for _ in range(3):
        out = sim.step()
        assert out.status == WORKER_STATUS, "the mirrored status is left exactly as it is"
        assert out.create == [] and out.events == []
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")


def test_manager_reports_pods_ready_from_the_mirrored_phase() -> None:
    sim = mk_job()
    sim.step()
    sim.dispatch()
    sim.step()  # no mirrored status yet: the pods are not ready anywhere
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "WaitForStart")
    sim.mirror({**WORKER_STATUS, "phase": "Running"})
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and ready["reason"] == "Started"
    sim.mirror({**WORKER_STATUS, "phase": "Restarting"})
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "WaitForRecovery")
    n = len(sim.applied)
    sim.step()
    assert len(sim.applied) == n, "an unchanged condition is not applied again"


def test_manager_resets_an_eviction_once_the_worker_stopped_the_pods() -> None:
    sim = mk_job()
    sim.step()
    sim.dispatch()
    sim.mirror(WORKER_STATUS)
    sim.step()
    sim.evict("Deactivated", "The workload is deactivated")
    sim.step()
    assert sim.resets == 0, "the worker's pods still run (they checkpoint first)"
    sim.mirror({**WORKER_STATUS, "phase": "Queued"})
    sim.step()
    assert sim.resets == 1
    assert sim.workload is not None and "admission" not in sim.workload["status"]


def test_manager_suspend_deletes_the_workload_then_says_suspended() -> None:
    sim = mk_job()
    sim.step()
    sim.dispatch()
    sim.mirror(WORKER_STATUS)
    sim.step()
    sim.job["spec"]["suspend"] = True
    sim.job["metadata"]["generation"] = 2
    out = sim.step()
    assert out.status == WORKER_STATUS and sim.workload is None
    sim.step()
    assert sim.status["phase"] == "Suspended" and sim.workload is None


def test_manager_deletes_the_job_ttl_seconds_after_the_mirrored_end() -> None:
    sim = mk_job({"ttlSecondsAfterFinished": 60})
    sim.step()
    sim.dispatch()
    sim.step()
    ended = {**WORKER_STATUS, "phase": "Succeeded", "completionTime": "2026-11-22T12:00:00Z"}
    sim.mirror(ended)
    sim._set(cond("Finished", "True", "Succeeded", "the job Succeeded"))
    out = sim.step()
    assert not out.delete_job and 59 < out.requeue_after <= 61
    sim.now += timedelta(seconds=61)
    assert sim.step().delete_job


def test_manager_without_a_queue_label_says_so_and_creates_nothing() -> None:
    sim = mk_job(queue=None)
    out = sim.step()
    assert out.workload is None and sim.workload is None
    admitted = next(c for c in sim.status["conditions"] if c["type"] == "Admitted")
    assert admitted["message"] == NO_LABEL


def test_manager_fails_an_invalid_spec_without_a_workload() -> None:
    sim = mk_job({"parallelism.tensor": 3})
    out = sim.step()
    assert sim.status["phase"] == "Failed" and sim.workload is None and out.workload is None
    failed = next(c for c in sim.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "parallelism.tensor" in failed["message"]


# --- the worker ----------------------------------------------------------------------------


def copied_workload(admitted: bool = True) -> dict[str, Any]:
    """The Workload MultiKueue makes on the worker: the manager's (rendered for the manager's
    job), without ownerReferences and the job-uid label, with the origin label."""
    manager_job = job_of({"managedBy": MULTIKUEUE}, name="job")
    manager_job = manager_job.model_copy(
        update={
            "metadata": manager_job.metadata.model_copy(
                update={"uid": "uid-m", "labels": {kueue.LABEL_QUEUE_NAME: "gpus"}}
            )
        }
    )
    wl = kueue.render_workload(manager_job, plan(manager_job.spec))
    meta = wl["metadata"]
    meta.pop("ownerReferences")
    meta["labels"].pop(kueue.LABEL_JOB_UID)
    meta["labels"][kueue.LABEL_MULTIKUEUE_ORIGIN] = "multikueue"
    meta["resourceVersion"] = "7"
    wl["status"] = {}
    if admitted:
        wl["status"]["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {
                    "name": "trainer",
                    "count": 2,
                    "flavors": {"nvidia.com/gpu": "h100", "cpu": "h100"},
                }
            ],
        }
        wl["status"]["conditions"] = [
            cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
            cond("Admitted", "True", "Admitted", "The workload is admitted"),
        ]
    return wl


@dataclass
class WorkerSim(QueueSim):
    adopted: int = 0

    def step(self, **kw: Any) -> Outcome:
        out = super().step(**kw)
        if out.workload is not None and out.workload.adopt is not None:
            assert self.workload is not None
            patch = out.workload.adopt["metadata"]
            assert patch["resourceVersion"] == self.workload["metadata"]["resourceVersion"]
            self.workload["metadata"]["ownerReferences"] = patch["ownerReferences"]
            self.workload["metadata"]["labels"].update(patch["labels"])
            self.adopted += 1
        return out


def worker_job(workload: dict[str, Any] | None, where: str = "annotations") -> WorkerSim:
    """The job MultiKueue copies to the worker: the prebuilt Workload's name in an annotation
    (Kueue 0.18+, WorkloadIdentifierAnnotations) or a label (before)."""
    sim = queued()
    name = copied_workload()["metadata"]["name"]
    meta = sim.job["metadata"]
    meta["uid"] = "uid-w"
    meta.setdefault(where, {})[kueue.PREBUILT_WORKLOAD] = name
    meta["labels"][kueue.LABEL_MULTIKUEUE_ORIGIN] = "multikueue"
    return WorkerSim(job=sim.job, workload=workload)


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_worker_takes_over_the_prebuilt_workload_and_runs(where: str) -> None:
    wl = copied_workload()
    sim = worker_job(wl, where)
    sim.step()
    assert sim.adopted == 1
    refs = (sim.workload or {})["metadata"]["ownerReferences"]
    assert [(r["uid"], r["controller"]) for r in refs] == [("uid-w", True)]
    assert (sim.workload or {})["metadata"]["labels"][kueue.LABEL_JOB_UID] == "uid-w"
    assert sim.status["workload"] == wl["metadata"]["name"] != kueue.workload_name("job", "uid-w")
    assert sorted(sim.pods) == ["job-a0-0", "job-a0-1"], "admitted: the pods are created"
    sim.step()
    assert sim.adopted == 1, "taken over once"
    sim.run_all()
    sim.ready_all()
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and ready["reason"] == "Started"


def test_worker_waits_for_the_prebuilt_workload_and_never_makes_its_own() -> None:
    sim = worker_job(None)
    out = sim.step()
    assert sim.workload is None and out.create == [] and sim.pods == {}
    admitted = next(c for c in sim.status["conditions"] if c["type"] == "Admitted")
    assert "which MultiKueue makes" in admitted["message"]


def test_worker_never_takes_a_workload_another_object_controls() -> None:
    wl = copied_workload()
    wl["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "other", "uid": "u9", "controller": True}
    ]
    sim = worker_job(wl)
    out = sim.step()
    assert sim.pods == {} and sim.applied == [] and sim.adopted == 0  # not written at all
    assert out.workload is None or (out.workload.adopt is None and not out.workload.delete)
    assert any("controlled by Job other" in m for _, m in sim.events)


def test_worker_never_takes_a_workload_of_another_manager() -> None:
    wl = copied_workload()
    wl["metadata"]["labels"][kueue.LABEL_MULTIKUEUE_ORIGIN] = "another-manager"
    sim = worker_job(wl)
    out = sim.step()
    assert sim.pods == {} and sim.applied == [] and sim.adopted == 0  # not written at all
    assert out.workload is None or (out.workload.adopt is None and not out.workload.delete)
    assert any("MultiKueue manager 'another-manager'" in m for _, m in sim.events)


def test_worker_finishes_an_out_of_sync_workload_instead_of_running() -> None:
    wl = copied_workload()
    wl["spec"]["podSets"][0]["count"] = 4
    sim = worker_job(wl)
    sim.step()
    assert sim.pods == {}
    finished = sim.kueue_condition("Finished")
    assert finished is not None and (finished["status"], finished["reason"]) == (
        "True",
        "OutOfSync",
    )
    assert sim.phase() is WorkloadPhase.FINISHED
    sim.step()
    assert sim.workload is not None, "a prebuilt Workload is never deleted or replaced here"
    assert sim.pods == {}


# --- another job's Workload named by a label -----------------------------------------------


class _Custom:
    """The Workload reads of `Queues.observe`: every name asked for, and one stored Workload."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored, self.asked = stored, []

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str,
                                     name: str, **kw: Any) -> Any:  # fmt: skip
        from kubernetes.client.exceptions import ApiException

        self.asked.append(name)
        if name != self.stored["metadata"]["name"]:
            raise ApiException(status=404)
        body = json.dumps(self.stored).encode()
        return type("Resp", (), {"data": body, "release_conn": lambda self: None})()


def test_the_manager_never_takes_the_workload_a_prebuilt_label_names() -> None:
    from types import SimpleNamespace

    from megatron_operator.cluster.workloads import Queues

    # A dispatched Workload of another job; the hostile job names it in the prebuilt label.
    victim = copied_workload()
    victim["metadata"]["ownerReferences"] = [
        {"apiVersion": "megatron.dev/v1alpha1", "kind": "MegatronJob", "name": "victim",
         "uid": "uid-v", "controller": True}
    ]  # fmt: skip
    victim["status"]["clusterName"] = "worker-1"
    sim = mk_job({"suspend": True})
    sim.job["metadata"]["labels"][kueue.PREBUILT_WORKLOAD] = victim["metadata"]["name"]
    custom = _Custom(victim)
    queues = Queues(SimpleNamespace(custom=custom, client=None))  # type: ignore[arg-type]
    seen = queues.observe(sim.job)
    assert custom.asked == [kueue.workload_name("job", "uid-m")]  # its own name only
    assert seen is not None and seen.workload is None
    assert kueue.job_workload_name(load_job(sim.job)) == kueue.workload_name("job", "uid-m")
    out = reconcile_dispatched(World(job=sim.job, pods=[], now=sim.now, queue=seen))
    assert out.workload is None or (not out.workload.delete and not out.workload.conditions)


def test_a_worker_job_never_touches_another_jobs_workload_its_label_names() -> None:
    wl = copied_workload()  # the Workload of the job "job"
    sim = worker_job(wl)
    sim.job["metadata"]["name"] = "evil"
    out = sim.step()
    assert sim.adopted == 0 and sim.applied == [] and sim.pods == {}
    assert out.workload is None or (out.workload.adopt is None and not out.workload.delete)
    assert sim.workload == wl
    assert any("which is not this job's" in m for _, m in sim.events)
