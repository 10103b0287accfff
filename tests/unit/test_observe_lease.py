"""The progress Lease as the operator reads it, and how the state machine uses it: the record of
the current attempt becomes status.progress, and its renewTime is the hang rule's heartbeat."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from megatron_contract.paths import PROGRESS_ANNOTATION
from megatron_operator.core.observe import lease_view
from megatron_operator.local.runner import file_lease

from .sim import T0, Sim
from .specs import job_doc, spec_of


def _lease(record: Any = None, renew: str | None = None, holder: Any = "j-0") -> dict[str, Any]:
    annotations = {} if record is None else {PROGRESS_ANNOTATION: record}
    spec: dict[str, Any] = {"holderIdentity": holder}
    if renew is not None:
        spec["renewTime"] = renew
    return {"metadata": {"name": "j-progress", "annotations": annotations}, "spec": spec}


RECORD = json.dumps({"attempt": 2, "iteration": 40, "loss": 2.5, "time": "2026-11-22T12:00:00Z"})


def test_lease_view_reads_record_heartbeat_and_holder() -> None:
    view = lease_view(_lease(RECORD, renew="2026-11-22T12:00:01.250000Z"))
    assert view is not None and view.progress is not None
    assert (view.progress.attempt, view.progress.iteration, view.progress.loss) == (2, 40, 2.5)
    assert view.renew_time == T0 + timedelta(seconds=1.25)  # a MicroTime, to the microsecond
    assert view.holder == "j-0"
    assert view.for_attempt(2) is view
    assert view.for_attempt(3) is None  # a late write of an older attempt


@pytest.mark.parametrize(
    "raw",
    [
        _lease(None),
        _lease("not json"),
        _lease(json.dumps([1, 2])),
        _lease(json.dumps({"iteration": 4, "time": "2026-11-22T12:00:00Z"})),  # no attempt
        _lease(json.dumps({"attempt": "x", "iteration": 4, "time": "2026-11-22T12:00:00Z"})),
        _lease(json.dumps({"attempt": 0, "iteration": 4, "time": "yesterday"})),
    ],
)
def test_a_record_not_in_the_contract_shape_is_no_progress(raw: dict[str, Any]) -> None:
    view = lease_view(raw)
    assert view is not None and view.progress is None and view.for_attempt(0) is None


def test_only_the_jobs_own_lease_counts() -> None:
    mine = _lease(RECORD)
    mine["metadata"]["ownerReferences"] = [
        {"uid": "u-1", "controller": True, "kind": "MegatronJob"}
    ]
    assert lease_view(mine, "u-1") is not None
    assert lease_view(mine, "u-2") is None  # a Lease of that name that someone else made
    assert lease_view(_lease(RECORD), "u-1") is None  # no owner at all
    mine["metadata"]["ownerReferences"][0]["controller"] = False
    assert lease_view(mine, "u-1") is None


def test_lease_view_of_odd_objects_never_raises() -> None:
    assert lease_view(None) is None
    assert lease_view({}) == lease_view({"metadata": None, "spec": None})
    odd = lease_view({"metadata": {}, "spec": {"holderIdentity": 5, "renewTime": 7}})
    assert odd is not None and odd.holder is None and odd.renew_time is None


def _running(hang: int = 60, strategy: str = "InPlace", first_step: int = 1800) -> Sim:
    policy = {
        "hangTimeoutSeconds": hang,
        "strategy": strategy,
        "firstStepTimeoutSeconds": first_step,
    }
    doc = job_doc(
        spec_of(
            {
                "resources.nodes": 2,
                "training.globalBatchSize": 64,
                "restartPolicy": policy,
            }
        ),
        name="job",
    )
    doc["metadata"].update(uid="uid-1", generation=1)
    sim = Sim(job=doc)
    sim.settle()
    sim.run_all()
    sim.step()
    assert sim.status["phase"] == "Running"
    return sim


def test_the_operator_creates_the_lease_with_the_other_children() -> None:
    sim = _running()
    assert sim.lease is not None
    assert sim.lease["metadata"]["name"] == "job-progress"


def test_status_progress_follows_the_lease_of_the_current_attempt() -> None:
    sim = _running()
    sim.report_progress(10)
    sim.step()
    assert sim.status["progress"]["iteration"] == 10
    sim.tick(5)
    sim.report_progress(20)
    sim.step()
    assert sim.status["progressSummary"].startswith("20/")


def test_a_late_write_of_an_old_attempt_is_ignored() -> None:
    # Recreate: a new gang is held to firstStepTimeoutSeconds (here 30 s) from its start (an
    # in-place attempt, to inPlaceTimeoutSeconds until its first step).
    sim = _running(hang=30, strategy="Recreate", first_step=30)
    sim.fail("job-a0-1")
    sim.settle()
    sim.tick(60)  # past the restart backoff
    sim.settle()
    sim.run_all()
    sim.step()
    assert (sim.status["phase"], sim.status["restartAttempt"]) == ("Running", 1)
    # Attempt 0's rank 0, still stopping, writes after attempt 1 started: not progress, and not
    # a heartbeat either.
    sim.tick(20)
    sim.report_progress(999, attempt=0)
    sim.step()
    assert "progress" not in sim.status
    sim.tick(11)
    sim.step()
    assert sim.status["phase"] == "Restarting"
    assert sim.status["lastFailure"]["reason"] == "Hang"


def test_renew_time_is_the_heartbeat() -> None:
    sim = _running(hang=30)
    for _ in range(4):  # 80 s of regular writes: alive well past the timeout
        sim.tick(20)
        sim.report_progress(5)
        sim.step()
        assert sim.status["phase"] == "Running"
    sim.tick(31)  # then silence
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "Hang"
    assert "no progress for 31s" in sim.status["lastFailure"]["message"]


def test_a_renew_time_far_in_the_future_neither_raises_nor_keeps_the_job_alive() -> None:
    sim = _running(hang=30)
    assert sim.lease is not None
    sim.report_progress(5)
    sim.lease["spec"]["renewTime"] = "9999-12-31T23:59:59.999999Z"
    sim.tick(10)
    sim.step()
    assert sim.status["phase"] == "Running"
    sim.tick(25)
    sim.step()
    assert sim.status["lastFailure"]["reason"] == "Hang"


def test_mjob_run_local_reads_its_progress_file_as_the_lease() -> None:
    record = {"attempt": 1, "iteration": 7, "loss": None, "time": "2026-11-22T12:00:00Z"}
    view = file_lease(record)
    assert view is not None and view.progress is not None
    assert view.renew_time == T0 and view.progress.iteration == 7  # its time is the heartbeat
    assert view.for_attempt(1) is view and view.for_attempt(0) is None
    assert file_lease(None) is None
    assert file_lease({"iteration": 7, "time": "2026-11-22T12:00:00Z"}) is None  # no attempt
