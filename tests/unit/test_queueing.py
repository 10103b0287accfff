"""A queued job's life through the pure state machine (core/queueing.py via reconcile).

`QueueSim` plays both the operator's shell (it performs the Workload writes of each Outcome on an
in-memory Workload) and Kueue (a test admits, evicts or finishes that Workload by hand, with the
JSON Kueue v0.19 writes). tests/integration/test_kueue_operator.py runs the same story against
the real Kueue controller.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_operator.core import kueue
from megatron_operator.core.kueue import WorkloadPhase
from megatron_operator.core.queueing import QueueWorld
from megatron_operator.core.reconcile import Outcome, World, reconcile

from .sim import Sim
from .specs import job_doc, spec_of
from .test_kueue import cond

GPU = "nvidia.com/gpu"
FLAVOR = {
    "apiVersion": kueue.API_VERSION,
    "kind": "ResourceFlavor",
    "metadata": {"name": "h100"},
    "spec": {
        "nodeLabels": {"gpu": "h100"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


@dataclass
class QueueSim(Sim):
    workload: dict[str, Any] | None = None
    flavors: dict[str, Any] = field(default_factory=lambda: {"h100": FLAVOR})
    priority: int | None = None
    problem: str | None = None
    applied: list[dict[str, Any]] = field(default_factory=list)
    resets: int = 0
    version: int = 1

    def world(self) -> World:
        base = super().world()
        labels = self.job["metadata"].get("labels") or {}
        if kueue.LABEL_QUEUE_NAME not in labels:
            return base
        queue = QueueWorld(
            labels[kueue.LABEL_QUEUE_NAME],
            copy.deepcopy(self.workload),
            self.flavors,
            self.priority,
            self.problem,
        )
        return World(**{**base.__dict__, "queue": queue})

    def step(self, **kw: Any) -> Outcome:
        out = super().step(**kw)
        actions = out.workload
        if actions is None:
            return out
        if actions.delete:
            self.workload = None
        if actions.create:
            self.workload = copy.deepcopy(actions.create)
            self.workload["metadata"]["resourceVersion"] = str(self.version)
            self.workload["status"] = {}
        if actions.reset:
            assert self.workload is not None
            patch = kueue.eviction_reset_patch(self.workload, self.now)
            self.workload["status"].update(patch["status"])
            self.workload["status"].pop("admission")
            self.resets += 1
        for c in actions.conditions:
            assert self.workload is not None and actions.workload == self.name
            self.applied.append(c)
            conds = [x for x in self.conditions if x["type"] != c["type"]]
            self.workload["status"]["conditions"] = [*conds, c]
        return out

    @property
    def name(self) -> str:
        assert self.workload is not None
        return str(self.workload["metadata"]["name"])

    @property
    def conditions(self) -> list[dict[str, Any]]:
        assert self.workload is not None
        return list(self.workload["status"].get("conditions") or [])

    def kueue_condition(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.conditions if c["type"] == type_), None)

    # --- playing Kueue
    def _set(self, *conds: dict[str, Any]) -> None:
        types = {c["type"] for c in conds}
        kept = [c for c in self.conditions if c["type"] not in types]
        assert self.workload is not None
        self.workload["status"]["conditions"] = [*kept, *conds]

    def pend(self, message: str) -> None:
        self._set(cond("QuotaReserved", "False", "Pending", message))

    def admit(self, flavor: str = "h100") -> None:
        assert self.workload is not None
        self.workload["status"]["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "trainer", "count": 2, "flavors": {GPU: flavor, "cpu": flavor}}
            ],
        }
        again = []
        if self.kueue_condition("Evicted") is not None:
            # Kueue clears an earlier eviction when it reserves quota again.
            again.append(cond("Evicted", "False", "QuotaReserved", "Previously: evicted"))
        self._set(
            cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
            cond("Admitted", "True", "Admitted", "The workload is admitted"),
            *again,
        )

    def evict(self, reason: str = "Preempted", message: str = "Preempted by a higher one") -> None:
        self._set(cond("Evicted", "True", reason, message))

    def phase(self) -> WorkloadPhase:
        assert self.workload is not None
        return kueue.workload_state(self.workload).phase

    def ready_all(self) -> None:
        for p in self.pods.values():
            if p["status"]["phase"] == "Running":
                p["status"]["conditions"] = [{"type": "Ready", "status": "True"}]


def queued(changes: dict[str, Any] | None = None, **labels: str) -> QueueSim:
    doc = job_doc(spec_of(changes), name="job")
    doc["metadata"].update(
        uid="uid-1", generation=1, labels={kueue.LABEL_QUEUE_NAME: "gpus", **labels}
    )
    return QueueSim(job=doc)


def _running(sim: QueueSim) -> None:
    sim.step()
    sim.admit()
    sim.step()
    sim.step()
    sim.run_all()
    sim.ready_all()
    sim.step()
    assert sim.status["phase"] == "Running"


def test_a_labelled_job_is_queued_and_creates_its_workload_but_no_pod() -> None:
    sim = queued()
    out = sim.step()
    st = sim.status
    assert st["phase"] == "Queued" and sim.pods == {} and out.create == []
    assert st["workload"] == kueue.workload_name("job", "uid-1") == sim.name
    assert st["localQueue"] == "gpus"
    assert sim.workload is not None and sim.workload["spec"]["queueName"] == "gpus"
    assert sim.workload["spec"]["podSets"][0]["count"] == 2
    assert any("queued in LocalQueue gpus" in m for _, m in sim.events)
    assert "startTime" not in st  # never started: deleting it leaves nothing to clean up


def test_kueues_pending_message_is_copied_once() -> None:
    sim = queued()
    sim.step()
    message = "couldn't assign flavors to pod set trainer: insufficient quota for nvidia.com/gpu"
    sim.pend(message)
    sim.step()
    sim.step()
    assert [r for r, m in sim.events if m == message] == ["Queued"]
    admitted = next(c for c in sim.status["conditions"] if c["type"] == "Admitted")
    assert (admitted["status"], admitted["message"]) == ("False", message)
    assert sim.status["phase"] == "Queued" and sim.pods == {}
    # PodsReady is reported as Kueue's own job controller does: WaitForStart while waiting.
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and ready["reason"] == "WaitForStart"


def test_admission_creates_the_pods_merged_with_the_flavor() -> None:
    sim = queued()
    sim.step()
    sim.admit()
    sim.step()
    assert sim.status["phase"] == "Pending"
    assert (sim.status["clusterQueue"], sim.status["flavors"]) == ("cq", ["h100"])
    assert sorted(sim.pods) == ["job-a0-0", "job-a0-1"]
    for p in sim.pods.values():
        assert p["spec"]["nodeSelector"]["gpu"] == "h100"
        assert {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
            "tolerations"
        ]
        assert p["metadata"]["labels"][kueue.LABEL_PODSET] == "trainer"
        assert kueue.LABEL_QUEUE_NAME not in p["metadata"]["labels"]
    assert any(r == "Admitted" and "ClusterQueue cq" in m for r, m in sim.events)
    sim.step()
    sim.run_all()
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "WaitForStart")
    sim.ready_all()
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")
    applied = len(sim.applied)
    sim.step()
    assert len(sim.applied) == applied  # unchanged: not written again


def test_a_flavor_that_contradicts_the_pods_creates_none() -> None:
    sim = queued({"resources.nodeSelector": {"gpu": "a100"}})
    sim.step()
    sim.admit()
    sim.step()
    assert sim.pods == {}
    sched = next(c for c in sim.status["conditions"] if c["type"] == "PodsScheduled")
    assert sched["reason"] == "AdmissionConflict" and "gpu" in sched["message"]
    assert [r for r, _ in sim.events].count("AdmissionConflict") == 1


def test_eviction_stops_the_pods_then_resets_and_readmission_recreates_them() -> None:
    sim = queued()
    _running(sim)
    before = (sim.status["restarts"], sim.status["restartsCounted"])
    sim.evict()
    out = sim.step()
    st = sim.status
    assert st["phase"] == "Queued"
    assert sorted(out.delete_pods) == ["job-a0-0", "job-a0-1"]
    assert sim.resets == 0, "no reset while a pod may still be live: the quota stays held"
    assert any(r == "Evicted" and "Preempted" in m for r, m in sim.events)
    assert "clusterQueue" not in st
    sim.step()
    assert sim.resets == 0
    sim.finish_deletions()
    sim.step()
    assert sim.resets == 1 and sim.phase() is WorkloadPhase.PENDING
    requeued = sim.kueue_condition("Requeued")
    assert requeued is not None and (requeued["status"], requeued["reason"]) == (
        "True",
        "Preempted",
    )
    assert (sim.status["restarts"], sim.status["restartsCounted"]) == before
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and ready["reason"] == "WaitForStart"  # a re-admission starts over
    sim.admit()
    sim.step()
    assert sim.attempts() == {"1"} and len(sim.pods) == 2
    assert sim.status["phase"] == "Pending"
    sim.step()
    sim.run_all()
    sim.ready_all()
    sim.step()
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")
    assert sim.status["phase"] == "Running"


@pytest.mark.parametrize(
    ("rung", "attempts"),
    [("InPlace", {"0"}), ("ReplacePod", {"0", "1"}), ("Recreate", {"1"})],
)
def test_a_restart_on_any_rung_keeps_the_admission_and_pods_ready_reflects_it(
    rung: str, attempts: set[str]
) -> None:
    policy: dict[str, Any] = {"backoffSeconds": 0, "maxBackoffSeconds": 0}
    if rung == "Recreate":
        policy["strategy"] = "Recreate"
    sim = queued({"restartPolicy": policy})
    _running(sim)
    if rung == "InPlace":
        sim.report_launchers(failures=[(1, 1)])  # a rank of pod 1 exited 1, the pod runs on
    else:
        sim.fail("job-a0-1")
    sim.step()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["lastFailure"]["rung"] == rung
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "WaitForRecovery")
    sim.settle()
    sim.run_all()
    sim.ready_all()
    sim.step()
    assert sim.status["phase"] == "Running" and sim.attempts() == attempts
    assert sim.status["restartAttempt"] == 1
    ready = sim.kueue_condition("PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Recovered")
    assert sim.phase() is WorkloadPhase.ADMITTED and sim.resets == 0
    assert sim.status["restartsCounted"] == 1


def test_success_finishes_the_workload() -> None:
    sim = queued()
    _running(sim)
    sim.succeed_all()
    sim.step()
    assert sim.status["phase"] == "Succeeded"
    finished = sim.kueue_condition("Finished")
    assert finished is not None and (finished["status"], finished["reason"]) == (
        "True",
        "Succeeded",
    )
    applied = len(sim.applied)
    sim.step()
    assert len(sim.applied) == applied


def test_a_final_failure_finishes_the_workload_failed() -> None:
    sim = queued({"restartPolicy": {"maxRestarts": 0}})
    _running(sim)
    sim.fail("job-a0-0")
    sim.step()
    assert sim.status["phase"] == "Failed"
    finished = sim.kueue_condition("Finished")
    assert finished is not None and finished["reason"] == "Failed"


def test_a_job_moved_to_another_queue_replaces_its_pending_workload() -> None:
    sim = queued()
    sim.step()
    sim.job["metadata"]["labels"][kueue.LABEL_QUEUE_NAME] = "other"
    out = sim.step()
    assert out.workload is not None and out.workload.delete == sim.status["workload"]
    assert sim.workload is None
    sim.step()
    assert sim.workload is not None and sim.workload["spec"]["queueName"] == "other"
    assert sim.status["localQueue"] == "other"


def test_a_missing_priority_class_is_explained_and_creates_nothing() -> None:
    sim = queued(**{kueue.LABEL_PRIORITY_CLASS: "high"})
    sim.problem = "metadata.labels: WorkloadPriorityClass high does not exist"
    sim.step()
    assert sim.workload is None and sim.status["phase"] == "Queued"
    assert ("Queued", sim.problem) in sim.events
    sim.problem, sim.priority = None, 1000
    sim.step()
    assert sim.workload is not None and sim.workload["spec"]["priority"] == 1000


def test_deactivation_says_so_and_suspend_gives_the_workload_back() -> None:
    sim = queued()
    _running(sim)
    assert sim.workload is not None
    sim.workload["spec"]["active"] = False
    sim.evict("Deactivated", "The workload is deactivated")
    sim.settle()
    assert sim.pods == {} and sim.resets == 1
    assert any("is deactivated" in m for _, m in sim.events)
    sim.job["spec"]["suspend"] = True
    sim.step()
    assert sim.status["phase"] == "Suspended" and sim.workload is None


def test_without_the_label_no_workload_is_touched() -> None:
    sim = queued()
    sim.job["metadata"]["labels"] = {}
    out = sim.step()
    assert out.workload is None and len(sim.pods) == 2
    assert "workload" not in sim.status and sim.status["phase"] == "Pending"


def test_a_workload_deleted_under_a_running_job_stops_it_and_makes_a_new_one() -> None:
    sim = queued()
    _running(sim)
    sim.workload = None
    sim.step()
    assert sim.status["phase"] == "Queued" and sim.workload is None  # pods still stopping
    sim.finish_deletions()
    sim.tick(1)
    sim.step()
    assert sim.workload is not None and sim.pods == {}
    assert any(m.endswith("is no longer admitted; stopping the pods") for _, m in sim.events)


_TYPES = ["QuotaReserved", "Admitted", "Evicted", "Requeued", "PodsReady", "Finished"]
_REASONS = ["Pending", "QuotaReserved", "Admitted", "Preempted", "Deactivated", "Succeeded"]


@st.composite
def _worlds(draw: st.DrawFn) -> QueueSim:
    """A queued job in any phase, with or without pods, and its Workload in any shape Kueue's
    schema allows (any set of conditions, admitted or not, the flavor readable or not)."""
    sim = queued()
    sim.step()
    assert sim.workload is not None
    conds = [
        cond(t, draw(st.sampled_from(["True", "False"])), draw(st.sampled_from(_REASONS)))
        for t in _TYPES
        if draw(st.booleans())
    ]
    sim.workload["status"] = {"conditions": conds}
    if draw(st.booleans()):
        sim.workload["status"]["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "trainer", "count": 2, "flavors": {GPU: "h100"}}],
        }
    if draw(st.booleans()):
        sim.flavors = {}
    if draw(st.booleans()):
        sim.workload = None
    phase = draw(st.sampled_from([None, "Queued", "Pending", "Running", "Restarting"]))
    status = dict(sim.job["status"])
    status.pop("phase", None)
    if phase is not None:
        status["phase"] = phase
    sim.job["status"] = status
    if sim.workload is not None and draw(st.booleans()):
        sim.admit()
    return sim


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_worlds(), st.booleans())
def test_no_pod_without_admission_and_no_reset_while_a_pod_lives(
    sim: QueueSim, with_pods: bool
) -> None:
    if with_pods:
        sim.job["status"]["restartAttempt"] = 0
        for rank in range(2):
            sim.pods[f"job-a0-{rank}"] = {
                "metadata": {
                    "name": f"job-a0-{rank}",
                    "labels": {
                        "megatron.dev/restart-attempt": "0",
                        "megatron.dev/node-rank": str(rank),
                    },
                },
                "spec": {"nodeName": f"node-{rank}"},
                "status": {"phase": "Running"},
            }
    state = kueue.workload_state(sim.workload) if sim.workload is not None else None
    out = reconcile(sim.world())
    if out.create_pods:
        assert state is not None and state.phase is WorkloadPhase.ADMITTED
        for p in out.create_pods:
            assert p["metadata"]["labels"][kueue.LABEL_PODSET] == "trainer"
            assert p["spec"]["nodeSelector"]["gpu"] == "h100"
    if out.workload is not None and out.workload.reset:
        assert not with_pods
    if state is None or state.phase is not WorkloadPhase.ADMITTED:
        assert out.status["phase"] in ("Queued", "Succeeded", "Failed")
        assert not out.create_pods
