"""The controller's expectations: while the pod cache has not yet shown our own creates and
deletes, a reconcile in between must not repeat them (a gang's 1,024 calls); after
EXPECT_SECONDS it may, since a call the cache never reflects must be retried."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from megatron_operator.cluster import controller as ctl
from megatron_operator.cluster.controller import EXPECT_SECONDS, Controller
from megatron_operator.cluster.kube import Kube
from megatron_operator.cluster.metrics import Metrics
from megatron_operator.core.observe import pod_view
from megatron_operator.core.planner import plan
from megatron_operator.core.reconcile import Outcome
from megatron_operator.core.render import Pods

from .specs import job_of

JOB = {"metadata": {"namespace": "team", "name": "job", "uid": "job-uid"}, "status": {}}


class FakeKube:
    """Records the calls `_apply` makes; the API itself is not what is under test here."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.pool = SimpleNamespace(submit=lambda *a, **k: None)

    def replace_status(self, job: Any, status: Any) -> None:
        pass

    def delete_pods(
        self, ns: str, names: list[str], uids: Any = None, force: bool = False, job: str = ""
    ) -> None:
        self.calls.append(("force" if force else "delete", tuple(names)))

    def ensure_children(self, objs: list[Any], uid: Any) -> None:
        self.calls.append(("children", tuple(o["kind"] for o in objs)))

    def create_pods(self, pods: list[Any], uid: Any) -> int:
        self.calls.append(("create", tuple(p["metadata"]["name"] for p in pods)))
        return len(pods)


def _outcome() -> Outcome:
    job = job_of(name="job", namespace="team")
    return Outcome(
        status={},
        delete_pods=["job-a0-0", "job-a0-1"],
        delete_uids={"job-a0-0": "u0", "job-a0-1": "u1", "job-a0-2": "u2"},
        force_delete=["job-a0-2"],
        create=[{"kind": "ConfigMap", "metadata": {"name": "job-config"}}],
        pods=Pods(job, plan(job.spec), [0], 1),  # job-a1-0
    )


def test_a_lagging_cache_does_not_repeat_our_creates_and_deletes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(ctl.time, "monotonic", lambda: clock[0])
    kube = FakeKube()
    c = Controller(cast(Kube, kube), Metrics())
    c._apply(dict(JOB), _outcome())
    assert kube.calls == [
        ("delete", ("job-a0-0", "job-a0-1")),
        ("force", ("job-a0-2",)),
        ("children", ("ConfigMap",)),
        ("create", ("job-a1-0",)),
    ]
    kube.calls.clear()
    clock[0] += 1.0
    c._apply(dict(JOB), _outcome())  # the cache has not shown any of it yet
    # A forced delete is never held back: the pod is already on its way out.
    assert kube.calls == [("force", ("job-a0-2",))]
    kube.calls.clear()
    clock[0] += EXPECT_SECONDS + 1
    c._apply(dict(JOB), _outcome())  # still not shown: the calls are made again
    assert [k for k, _ in kube.calls] == ["delete", "force", "children", "create"]


def test_expectations_are_kept_per_job() -> None:
    kube = FakeKube()
    c = Controller(cast(Kube, kube), Metrics())
    c._apply(dict(JOB), _outcome())
    other = {"metadata": {"namespace": "team", "name": "other", "uid": "x"}, "status": {}}
    kube.calls.clear()
    c._apply(other, _outcome())  # the same pod names in another job's table: not held back
    assert [k for k, _ in kube.calls] == ["delete", "force", "children", "create"]
    assert set(c.expected) == {("team", "job"), ("team", "other")}


def test_a_create_the_cache_has_shown_is_met_and_made_again_once_gone() -> None:
    # A spare deleted as it started: seen, then gone within EXPECT_SECONDS. It is made again
    # at once, not after the expectation runs out; while the cache shows only the older pod of
    # that name (deleting), the create stays expected.
    kube = FakeKube()
    c = Controller(cast(Kube, kube), Metrics())
    c._apply(dict(JOB), _outcome())
    expect = c.expected[("team", "job")]
    old = pod_view({"metadata": {"name": "job-a1-0", "deletionTimestamp": "2026-11-28T10:00:00Z"}})
    expect.seen([old])
    assert "job-a1-0" in expect.created
    expect.seen([pod_view({"metadata": {"name": "job-a1-0"}})])
    assert "job-a1-0" not in expect.created
    kube.calls.clear()
    c._apply(dict(JOB), _outcome())
    assert ("create", ("job-a1-0",)) in kube.calls
