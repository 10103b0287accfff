"""Hostile trainer data and a bug of ours, through the real Controller in this process, one
reconcile at a time, on the real apiserver (no operator process runs meanwhile: it would
reconcile the same jobs; tests/integration/test_operator_hostile.py has the ones with the
operator running).

- Hypothesis fuzzes the Lease annotation and the termination message through
  `Controller.reconcile_job`: every reconcile completes, the status it writes is accepted, and
  suspend and a Kueue eviction still take effect.
- A bug in the state machine (a double raising TypeError) leaves the pods running, backs off and
  counts the error; the job is not Failed.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_operator.cluster.controller import Controller
from megatron_operator.cluster.kube import Kube
from megatron_operator.cluster.metrics import Metrics
from megatron_operator.cluster.ratelimit import ProgressLimiter
from megatron_operator.cluster.workloads import Queues
from megatron_operator.core.names import (
    CONTAINER_NAME,
    LABEL_JOB_NAME,
    LABEL_JOB_UID,
    LABEL_NODE_RANK,
    LABEL_RESTART_ATTEMPT,
)
from megatron_operator.core.policy import DEFAULT_RULES
from megatron_operator.core.reconcile import Outcome, Settings, World
from tests.unit.test_hostile_trainer_data import HOSTILE_MESSAGES

from .conftest import Cluster
from .operator_support import (
    Op,
    install_crd,
    job,
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)
from .test_kueue_operator import _make_queue, queued_job
from .test_operator_hostile import (
    GROUP,
    PLURAL,
    RECORDS,
    VERSION,
    _bounded,
    _now,
    _patch_lease,
    _status_writable,
)

# The exit codes the default rules fail a job for, whatever its restart budget.
FAILING_CODES = {c for r in DEFAULT_RULES if r.action == "Fail" for c in r.exit_codes or ()}


# --- the Controller in this process, one reconcile at a time ---------------------------------
@pytest.fixture
def kube(cluster: Cluster) -> Iterator[Kube]:
    install_crd(cluster)
    k = Kube(cluster.api_client())
    try:
        yield k
    finally:
        k.gang.shutdown()
        k.pool.shutdown(wait=False)


def _drive(controller: Controller, ns: str, name: str, until: Any, timeout: float = 60) -> None:
    """Reconcile as the job loop would (sleeping what reconcile_job asks, at most 1 s) until
    `until(status)`."""
    deadline = time.monotonic() + timeout
    while True:
        delay = controller.reconcile_job(ns, name)
        assert not math.isinf(delay) or until(status_of(controller, ns, name))
        if until(status_of(controller, ns, name)):
            return
        assert time.monotonic() < deadline, status_of(controller, ns, name)
        time.sleep(min(max(delay, 0.1), 1.0))


def status_of(controller: Controller, ns: str, name: str) -> dict[str, Any]:
    doc = controller.kube.get_job(ns, name) or {}
    return dict(doc.get("status") or {})


_JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(
        ["²", "１２", "9" * 30, "9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59"]
    ),
)
_FIELDS = ["attempt", "iteration", "loss", "tokensPerSecond", "mfu", "checkpointIteration", "time"]
_RECORD = st.one_of(
    st.sampled_from(sorted(RECORDS)).map(RECORDS.__getitem__),
    st.text(max_size=300),
    st.dictionaries(
        st.sampled_from(_FIELDS),
        st.recursive(_JSON_LEAF, lambda c: st.lists(c, max_size=3), max_leaves=5),
        max_size=7,
    ).map(lambda d: json.dumps({"attempt": 0, "iteration": 1, "time": _now(), **d})),
)


def test_fuzzed_lease_records_through_the_controller_then_suspend_and_eviction_work(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    ns = namespace
    metrics = Metrics()
    controller = Controller(kube, metrics, queues=Queues(kube))
    controller.progress = ProgressLimiter(interval=0.0)  # copy every record: the fuzz target
    with _make_queue(cluster, ns, {"nodeLabels": {cluster.zone_key: "zone-a"}}) as q:
        cluster.apply(queued_job("fz", queue=q.local_queue, nodes=1), ns)
        _drive(controller, ns, "fz", lambda s: s.get("phase") == "Running")
        examples = 0

        @settings(
            max_examples=150,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(record=_RECORD)
        def one(record: str) -> None:
            nonlocal examples
            examples += 1
            _patch_lease(cluster, ns, "fz", record)
            delay = controller.reconcile_job(ns, "fz")
            assert not math.isinf(delay) and delay > 0
            st_ = status_of(controller, ns, "fz")
            assert st_["phase"] == "Running", st_
            _bounded(st_)

        one()
        assert examples == 150
        _status_writable(cluster, ns, "fz")
        errors = metrics.registry.get_sample_value(
            "megatron_operator_reconcile_errors_total", {"exception": "TypeError"}
        )
        assert not errors and not controller.guard.jobs

        # A Kueue eviction still takes effect: the job steps aside (Queued), its pods go.
        _patch_lease(cluster, ns, "fz", RECORDS["iteration 2**64"])
        workload = status_of(controller, ns, "fz")["workload"]
        cluster.kubectl(
            "patch", "workloads.kueue.x-k8s.io", workload, "-n", ns, "--type=merge",
            "-p", '{"spec":{"active":false}}',
        )  # fmt: skip
        _drive(controller, ns, "fz", lambda s: s.get("phase") == "Queued")
        # And so does spec.suspend.
        cluster.kubectl(
            "patch", "mj", "fz", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        _drive(controller, ns, "fz", lambda s: s.get("phase") == "Suspended")
        _status_writable(cluster, ns, "fz")


def _ghost_pod(job_doc: dict[str, Any], attempt: int) -> dict[str, Any]:
    """A pod of the job's attempt on a node that does not exist: no kubelet (nor kwok) touches
    it, so its status is what the test writes, as a trainer's container would have."""
    meta = job_doc["metadata"]
    name, uid = meta["name"], meta["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-a{attempt}-0",
            "labels": {
                LABEL_JOB_NAME: name,
                LABEL_JOB_UID: uid,
                LABEL_RESTART_ATTEMPT: str(attempt),
                LABEL_NODE_RANK: "0",
                "app.kubernetes.io/managed-by": "megatron-operator",
            },
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "MegatronJob",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": "no-such-node",
            "containers": [{"name": CONTAINER_NAME, "image": "trainer:test"}],
        },
    }


def test_fuzzed_termination_messages_through_the_controller(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    ns = namespace
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    doc = tiny_gpu_job("tm", nodes=1, restartPolicy={"maxRestarts": 10000, "backoffSeconds": 1})
    cluster.apply(doc, ns)
    controller = Controller(kube, Metrics())
    attempt = 100
    examples = 0

    @settings(
        max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        message=st.one_of(
            st.sampled_from(sorted(HOSTILE_MESSAGES)).map(HOSTILE_MESSAGES.__getitem__),
            st.text(max_size=20_000),
            st.binary(max_size=4000).map(lambda b: b.decode("utf-8", "replace")),
        ),
        # A failed pod's code that restarts the job: exiting 0 would be the job's success, and a
        # code a default rule fails the job for (78 configuration, 17 NaN) would end it.
        exit_code=st.integers(min_value=-(2**31), max_value=2**31 - 1).filter(
            lambda c: c != 0 and c not in FAILING_CODES
        ),
    )
    def one(message: str, exit_code: int) -> None:
        nonlocal attempt, examples
        examples += 1
        attempt += 1
        job_doc = job(cluster, ns, "tm")
        pod = _ghost_pod(job_doc, attempt)
        core.create_namespaced_pod(ns, pod)
        term = {"exitCode": exit_code, "reason": "Error", "message": message}
        core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            ns,
            {
                "status": {
                    "phase": "Failed",
                    "containerStatuses": [
                        {
                            "name": CONTAINER_NAME,
                            "image": "trainer:test",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {"terminated": term},
                        }
                    ],
                }
            },
        )
        since = (datetime.now(UTC) - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        job_doc["status"] = {
            **(job_doc.get("status") or {}),
            "phase": "Running",
            "restartAttempt": attempt,
            "launchedAttempt": attempt,
            "runningSince": since,
        }
        job_doc["status"].pop("restartAt", None)
        custom.replace_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "tm", job_doc)
        delay = controller.reconcile_job(ns, "tm")
        assert not math.isinf(delay)
        st_ = status_of(controller, ns, "tm")
        assert st_["phase"] == "Restarting" and st_["restartAttempt"] == attempt + 1, st_
        assert len(st_["lastFailure"]["message"]) <= 1100
        _bounded(st_)
        try:  # the controller deleted it (Restarting), and the pod GC may have removed it
            core.delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=0)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status != 404:
                raise

    one()
    assert examples == 40 and not controller.guard.jobs
    _status_writable(cluster, ns, "tm")
    cluster.kubectl(
        "patch", "mj", "tm", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    _drive(controller, ns, "tm", lambda s: s.get("phase") == "Suspended")


def _buggy(world: World, settings_: Settings) -> Outcome:
    raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")


def test_an_operator_bug_leaves_the_pods_running_and_backs_off(
    cluster: Cluster, namespace: str, kube: Kube, tmp_path: Path
) -> None:
    ns = namespace
    op = Op(cluster, tmp_path)
    op.start()
    try:
        cluster.apply(tiny_gpu_job("bug", nodes=2), ns)
        running = wait_pods(cluster, ns, "bug", 2, phase="Running")
        wait_phase(cluster, ns, "bug", "Running")
    finally:
        op.stop()  # from here only the buggy controller reconciles
    before = status(cluster, ns, "bug")
    metrics = Metrics()
    controller = Controller(kube, metrics, decide=_buggy)
    delays = [controller.reconcile_job(ns, "bug") for _ in range(5)]
    # Exponential backoff (jittered down by at most 20%), not a retry every few seconds.
    assert all(b > a for a, b in itertools.pairwise(delays)), delays
    assert delays[0] >= 0.8 and delays[-1] >= 12.8
    count = metrics.registry.get_sample_value(
        "megatron_operator_reconcile_errors_total", {"exception": "TypeError"}
    )
    assert count == 5
    time.sleep(2)
    after = pods(cluster, ns, "bug")
    assert {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in running}
    assert all(
        p["status"]["phase"] == "Running" and not p["metadata"].get("deletionTimestamp")
        for p in after
    )
    assert status(cluster, ns, "bug") == before  # not Failed; nothing written
    events = cluster.kubectl_json(
        "get", "events", "-n", ns, "--field-selector", "involvedObject.name=bug"
    )["items"]
    assert [e["reason"] for e in events].count("ReconcileError") == 1


def test_a_retained_claim_is_reused_only_with_its_seal(
    cluster: Cluster, namespace: str, kube: Kube
) -> None:
    """With a claim key, the operator seals the claims it retains; a job re-created under the
    same name reuses its sealed claim, and a claim someone labelled alike is a conflict."""
    ns = namespace
    kube.claim_key = b"k" * 32
    controller = Controller(kube, Metrics())
    cluster.apply(tiny_gpu_job("keep", nodes=1), ns)  # volume.create: retained by default
    _drive(controller, ns, "keep", lambda s: s.get("launchedAttempt") == 0)
    claim = cluster.kubectl_json("get", "pvc", "keep-checkpoints", "-n", ns)
    assert claim["metadata"]["annotations"]["megatron.dev/claim-seal"]
    assert not claim["metadata"].get("ownerReferences")
    cluster.kubectl("delete", "mj", "keep", "-n", ns, "--wait=true")
    cluster.apply(tiny_gpu_job("keep", nodes=1), ns)  # the same name again: resumes from it
    _drive(controller, ns, "keep", lambda s: s.get("launchedAttempt") == 0)
    again = cluster.kubectl_json("get", "pvc", "keep-checkpoints", "-n", ns)
    assert again["metadata"]["uid"] == claim["metadata"]["uid"]

    # A planted claim with the labels the operator puts on its own, but no seal.
    planted = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "victim-checkpoints",
            "labels": {
                "megatron.dev/job-name": "victim",
                "app.kubernetes.io/managed-by": "megatron-operator",
            },
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.apply(planted, ns)
    cluster.apply(tiny_gpu_job("victim", nodes=1), ns)

    def conflict(st_: dict[str, Any]) -> bool:
        return any(
            c.get("type") == "ChildrenOwned" and c.get("reason") == "ChildConflict"
            for c in st_.get("conditions") or []
        )

    _drive(controller, ns, "victim", conflict)
    st_ = status_of(controller, ns, "victim")
    message = next(c["message"] for c in st_["conditions"] if c["type"] == "ChildrenOwned")
    assert "did not seal it" in message and "claimName" in message
    assert not pods(cluster, ns, "victim")
