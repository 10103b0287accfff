"""The operator with the real Kueue controller (v0.19, `cluster up --kueue`): issue 13's
acceptance cases 1-7.

The operator runs as a process (`mjob operator`, `--kueue auto` finds Kueue); every test gets a
fresh namespace and its own ResourceFlavor, ClusterQueue and LocalQueue (cluster-scoped names are
unique per test). kwok plays kubelet; Kueue admits, evicts and ungates for real.
"""

# ruff: noqa: F811 - the `operator` fixture is imported, then shadowed by the parameters using it

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from megatron_operator.api import load_job
from megatron_operator.cluster.kube import Kube
from megatron_operator.cluster.workloads import APPLY_PATCH, Queues
from megatron_operator.core import kueue
from megatron_operator.core.planner import plan

from .conftest import Cluster
from .operator_support import (
    Op,
    condition,
    events,
    job,
    operator,  # noqa: F401 - fixture
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)

pytestmark = pytest.mark.timeout(300)

GPU = "nvidia.com/gpu"
TAINT = "megatron.dev/kueue-test"


@dataclass
class Queue:
    flavor: str
    cluster_queue: str
    local_queue: str


def _active(cluster: Cluster, name: str) -> bool:
    obj = cluster.kubectl_json("get", "clusterqueue", name)
    return any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _cluster_queue(name: str, flavor: str, namespace: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": kueue.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "16Ti"},
                                {"name": GPU, "nominalQuota": str(gpus)},
                            ],
                        }
                    ],
                }
            ],
        },
    }


@contextmanager
def _make_queue(
    cluster: Cluster, namespace: str, flavor_spec: dict[str, Any], gpus: int = 16
) -> Iterator[Queue]:
    suffix = uuid.uuid4().hex[:6]
    q = Queue(f"rf-{suffix}", f"cq-{suffix}", "gpus")
    objs = [
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": q.flavor},
            "spec": flavor_spec,
        },
        _cluster_queue(q.cluster_queue, q.flavor, namespace, gpus),
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": q.local_queue, "namespace": namespace},
            "spec": {"clusterQueue": q.cluster_queue},
        },
    ]
    for obj in objs:
        cluster.apply(obj)
    cluster.wait(lambda: _active(cluster, q.cluster_queue), 30, what="ClusterQueue Active")
    try:
        yield q
    finally:
        # The jobs first (their pods hold GPUs on the shared cluster), then Kueue's objects.
        cluster.kubectl(
            "delete", "mj", "--all", "-n", namespace, "--wait=true", "--timeout=50s", check=False
        )
        cluster.kubectl("delete", "clusterqueue", q.cluster_queue, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", q.flavor, "--wait=false", check=False)


@pytest.fixture
def queue(cluster: Cluster, namespace: str, operator: Op) -> Iterator[Queue]:
    """16 GPUs (two 2-node jobs' worth is 32) on a flavor for zone-a."""
    if not cluster.kueue:
        pytest.fail("these tests need Kueue: run the cluster with --kueue")
    with _make_queue(cluster, namespace, {"nodeLabels": {cluster.zone_key: "zone-a"}}) as q:
        yield q


def queued_job(name: str, queue: str = "gpus", nodes: int = 2, **spec: Any) -> dict[str, Any]:
    doc = tiny_gpu_job(name, nodes=nodes, **spec)
    doc["metadata"]["labels"] = {kueue.LABEL_QUEUE_NAME: queue}
    return doc


def workload(cluster: Cluster, ns: str, job_name: str) -> dict[str, Any]:
    name = status(cluster, ns, job_name)["workload"]
    result: dict[str, Any] = cluster.kubectl_json("get", "workloads.kueue.x-k8s.io", "-n", ns, name)
    return result


def wl_condition(cluster: Cluster, ns: str, job_name: str, type_: str) -> dict[str, Any] | None:
    return kueue.find_condition(workload(cluster, ns, job_name), type_)


def wait_wl(
    cluster: Cluster, ns: str, job_name: str, type_: str, want: tuple[str, str], timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        c = wl_condition(cluster, ns, job_name, type_)
        return c if c is not None and (c["status"], c["reason"]) == want else None

    result: dict[str, Any] = cluster.wait(check, timeout, what=f"{job_name}: {type_} {want}")
    return result


def gpus_reserved(cluster: Cluster, q: Queue) -> str:
    st = cluster.kubectl_json("get", "clusterqueue", q.cluster_queue).get("status") or {}
    for flavor in st.get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == GPU:
                return str(res.get("total"))
    return "0"


def complete_all(cluster: Cluster, ns: str, name: str) -> None:
    for p in pods(cluster, ns, name):
        if not p["metadata"].get("deletionTimestamp"):
            cluster.complete_pod(ns, p["metadata"]["name"])


def reasons(cluster: Cluster, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in events(cluster, ns, name)]


# 1 (and 5) ----------------------------------------------------------------------------------
def test_second_job_waits_for_quota_until_the_first_finishes(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    cluster.apply(queued_job("first"), ns)
    wait_pods(cluster, ns, "first", 2, phase="Running")
    wait_phase(cluster, ns, "first", "Running")
    cluster.apply(queued_job("second"), ns)

    def explained() -> dict[str, Any] | None:
        st = status(cluster, ns, "second")
        admitted = condition(st, "Admitted")
        ok = st.get("phase") == "Queued" and admitted and GPU in admitted["message"]
        return st if ok else None

    st = cluster.wait(explained, 60, what="second Queued with Kueue's message")
    assert pods(cluster, ns, "second") == []
    message = str((condition(st, "Admitted") or {})["message"])
    assert "quota" in message

    def posted() -> bool:
        # The event is posted after the status is written (the recorder is asynchronous), and
        # Kueue may word its message anew meanwhile: the status' message, as an event.
        now = str((condition(status(cluster, ns, "second"), "Admitted") or {}).get("message"))
        return any(e["message"] == now for e in events(cluster, ns, "second"))

    cluster.wait(posted, 30, what="an event with the Admitted condition's message")
    wl = workload(cluster, ns, "second")
    assert kueue.workload_state(wl).phase is kueue.WorkloadPhase.PENDING
    assert wl["metadata"]["ownerReferences"][0]["name"] == "second"
    assert (
        wl["metadata"]["labels"][kueue.LABEL_JOB_UID]
        == job(cluster, ns, "second")["metadata"]["uid"]
    )
    # What the user sees: `kubectl get mj` shows Queued with the LocalQueue.
    table = cluster.kubectl("get", "mj", "-n", ns).stdout.splitlines()
    assert table[0].split()[-2:] == ["QUEUE", "AGE"]
    row = next(line.split() for line in table if line.startswith("second"))
    assert row[1] == "Queued" and "gpus" in row
    first = status(cluster, ns, "first")
    assert (first["clusterQueue"], first["flavors"]) == (queue.cluster_queue, [queue.flavor])

    complete_all(cluster, ns, "first")
    wait_phase(cluster, ns, "first", "Succeeded")
    wait_wl(cluster, ns, "first", "Finished", ("True", "Succeeded"))
    wait_pods(cluster, ns, "second", 2, phase="Running", timeout=60)
    wait_phase(cluster, ns, "second", "Running")
    assert "Admitted" in reasons(cluster, ns, "second")


def test_a_succeeded_job_finishes_its_workload_and_frees_the_quota(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    cluster.apply(queued_job("done"), ns)
    wait_pods(cluster, ns, "done", 2, phase="Running")
    cluster.wait(lambda: gpus_reserved(cluster, queue) == "16", 30, what="16 GPUs reserved")
    complete_all(cluster, ns, "done")
    wait_phase(cluster, ns, "done", "Succeeded")
    finished = wait_wl(cluster, ns, "done", "Finished", ("True", "Succeeded"))
    assert "exited 0" in finished["message"]
    cluster.wait(lambda: gpus_reserved(cluster, queue) == "0", 30, what="the quota freed")


# 2 ------------------------------------------------------------------------------------------
@pytest.fixture
def tainted_rack(cluster: Cluster) -> Iterator[str]:
    """One rack's nodes tainted NoSchedule: only pods with the flavor's toleration fit there."""
    rack = sorted(cluster.racks)[-1]
    nodes = cluster.racks[rack]
    cluster.kubectl("taint", "nodes", *nodes, f"{TAINT}=yes:NoSchedule", "--overwrite")
    try:
        yield rack
    finally:
        cluster.kubectl("taint", "nodes", *nodes, f"{TAINT}-", check=False)


def test_pods_land_only_on_the_admitted_flavors_nodes(
    cluster: Cluster, namespace: str, operator: Op, tainted_rack: str
) -> None:
    ns = namespace
    toleration = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
    flavor = {"nodeLabels": {cluster.rack_key: tainted_rack}, "tolerations": [toleration]}
    with _make_queue(cluster, ns, flavor) as q:
        cluster.apply(queued_job("placed"), ns)
        running = wait_pods(cluster, ns, "placed", 2, phase="Running")
        rack_nodes = set(cluster.racks[tainted_rack])
        for p in running:
            assert p["spec"]["nodeSelector"][cluster.rack_key] == tainted_rack
            assert toleration in p["spec"]["tolerations"]
            assert p["metadata"]["labels"][kueue.LABEL_PODSET] == "trainer"
            assert kueue.LABEL_QUEUE_NAME not in p["metadata"]["labels"]
            assert p["spec"]["nodeName"] in rack_nodes
        assert status(cluster, ns, "placed")["flavors"] == [q.flavor]


# 3 ------------------------------------------------------------------------------------------
def test_deactivation_steps_aside_and_readmission_recreates_the_pods(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    cluster.apply(queued_job("victim"), ns)
    first = wait_pods(cluster, ns, "victim", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "victim", "Running")
    cluster.apply(queued_job("waiter"), ns)
    wait_phase(cluster, ns, "waiter", "Queued")
    name = status(cluster, ns, "victim")["workload"]

    cluster.kubectl(
        "patch",
        "workloads.kueue.x-k8s.io",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"active":false}}',
    )
    st = wait_phase(cluster, ns, "victim", "Queued")
    assert (st["restarts"], st["restartsCounted"]) == (0, 0)
    uids = {p["metadata"]["uid"] for p in first}
    cluster.wait(
        lambda: not {p["metadata"]["uid"] for p in pods(cluster, ns, "victim")} & uids,
        60,
        what="the evicted job's pods gone",
    )
    # The quota went to the waiting job; the evicted Workload was reset (no stale admission).
    wait_pods(cluster, ns, "waiter", 2, phase="Running", timeout=60)
    cluster.wait(
        lambda: workload(cluster, ns, "victim")["status"].get("admission") is None,
        30,
        what="the eviction reset",
    )
    admitted = wl_condition(cluster, ns, "victim", "Admitted")
    assert admitted is not None and admitted["status"] == "False"
    assert "Evicted" in reasons(cluster, ns, "victim")
    assert pods(cluster, ns, "victim") == []

    # Active again, and the quota frees: it is admitted again and its pods come back.
    cluster.kubectl(
        "patch",
        "workloads.kueue.x-k8s.io",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"active":true}}',
    )
    complete_all(cluster, ns, "waiter")
    wait_pods(cluster, ns, "victim", 2, phase="Running", attempt=1, timeout=90)
    st = wait_phase(cluster, ns, "victim", "Running")
    assert (st["restarts"], st["restartsCounted"], st["restartAttempt"]) == (0, 0, 1)


def test_preemption_by_a_higher_priority_job(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    suffix = uuid.uuid4().hex[:6]
    low, high = f"low-{suffix}", f"high-{suffix}"
    for name, value in ((low, 100), (high, 1000)):
        cluster.apply(
            {
                "apiVersion": kueue.API_VERSION,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    try:
        victim = queued_job("low")
        victim["metadata"]["labels"][kueue.LABEL_PRIORITY_CLASS] = low
        cluster.apply(victim, ns)
        wait_pods(cluster, ns, "low", 2, phase="Running", attempt=0)
        wait_phase(cluster, ns, "low", "Running")
        preemptor = queued_job("high")
        preemptor["metadata"]["labels"][kueue.LABEL_PRIORITY_CLASS] = high
        cluster.apply(preemptor, ns)

        st = wait_phase(cluster, ns, "low", "Queued")
        assert (st["restarts"], st["restartsCounted"]) == (0, 0)
        wait_pods(cluster, ns, "high", 2, phase="Running", timeout=90)
        requeued = wait_wl(cluster, ns, "low", "Requeued", ("True", "Preempted"))
        assert requeued is not None
        assert pods(cluster, ns, "low") == []
        evicted = [e for e in events(cluster, ns, "low") if e["reason"] == "Evicted"]
        assert evicted and "Preempted" in evicted[0]["message"]

        complete_all(cluster, ns, "high")
        wait_pods(cluster, ns, "low", 2, phase="Running", attempt=1, timeout=90)
        assert status(cluster, ns, "low")["restartsCounted"] == 0
    finally:
        for name in (low, high):
            cluster.kubectl("delete", "workloadpriorityclass", name, "--wait=false", check=False)


# 4 ------------------------------------------------------------------------------------------
def test_pods_ready_started_then_recovered_after_a_gang_restart(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    cluster.apply(queued_job("ready"), ns)
    wait_pods(cluster, ns, "ready", 2, phase="Running", attempt=0)
    wait_wl(cluster, ns, "ready", "PodsReady", ("True", "Started"))
    cluster.fail_pod(ns, "ready-a0-1", exit_code=1, wait=False)  # the gang goes at once
    wait_wl(cluster, ns, "ready", "PodsReady", ("False", "WaitForRecovery"))
    wait_pods(cluster, ns, "ready", 2, phase="Running", attempt=1, timeout=60)
    wait_wl(cluster, ns, "ready", "PodsReady", ("True", "Recovered"))
    wl = workload(cluster, ns, "ready")
    state = kueue.workload_state(wl)
    assert (
        state.phase is kueue.WorkloadPhase.ADMITTED and state.cluster_queue == queue.cluster_queue
    )
    assert kueue.find_condition(wl, "Evicted") is None
    assert status(cluster, ns, "ready")["restartsCounted"] == 1


# 6 ------------------------------------------------------------------------------------------
@pytest.fixture
def tas_queue(cluster: Cluster, namespace: str, operator: Op) -> Iterator[Queue]:
    """A Kueue Topology over the rack label and the hostname; a flavor for zone-b (two racks)."""
    topology = f"racks-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {
                "levels": [{"nodeLabel": cluster.rack_key}, {"nodeLabel": "kubernetes.io/hostname"}]
            },
        }
    )
    flavor = {"nodeLabels": {cluster.zone_key: "zone-b"}, "topologyName": topology}
    try:
        with _make_queue(cluster, namespace, flavor, gpus=32) as q:
            yield q
    finally:
        cluster.kubectl("delete", "topology", topology, "--wait=false", check=False)


def test_tas_packs_the_job_into_one_rack_in_rank_order(
    cluster: Cluster, namespace: str, tas_queue: Queue
) -> None:
    ns = namespace
    spec: dict[str, Any] = {"topology": {"key": cluster.rack_key, "mode": "required"}}
    cluster.apply(queued_job("packed", nodes=4, **spec), ns)
    running = wait_pods(cluster, ns, "packed", 4, phase="Running", timeout=90)
    assignment = kueue.workload_state(workload(cluster, ns, "packed")).assignment("trainer")
    assert assignment.topology_assignment is not None
    slots = kueue.topology_slots(assignment.topology_assignment)
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    racks = set()
    for p in running:
        rank = int(p["metadata"]["labels"]["megatron.dev/node-rank"])
        assert not p["spec"].get("schedulingGates")  # Kueue ungated it
        assert p["metadata"]["annotations"][kueue.ANNOTATION_REQUIRED_TOPOLOGY] == cluster.rack_key
        labels = nodes[p["spec"]["nodeName"]]["metadata"]["labels"]
        for key, value in slots[rank].items():
            assert labels[key] == value  # rank r on slot r: Kueue's rank order
        racks.add(labels[cluster.rack_key])
    assert len(racks) == 1, racks


# 7 ------------------------------------------------------------------------------------------
def test_deleting_a_queued_job_removes_its_workload(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    ns = namespace
    cluster.apply(queued_job("toolarge", nodes=3), ns)  # 24 GPUs: never fits in 16
    wait_phase(cluster, ns, "toolarge", "Queued")
    # An admitted, running job goes the same way (Kueue holds quota for it until then).
    cluster.apply(queued_job("running"), ns)
    wait_pods(cluster, ns, "running", 2, phase="Running")
    names = {}
    for job_name in ("toolarge", "running"):
        names[job_name] = cluster.wait(
            lambda j=job_name: status(cluster, ns, j).get("workload"), 30, what="the Workload"
        )
        cluster.wait(
            lambda n=names[job_name]: (
                cluster.kubectl(
                    "get", "workloads.kueue.x-k8s.io", "-n", ns, n, check=False
                ).returncode
                == 0
            ),
            30,
            what="the Workload created",
        )
    cluster.wait(lambda: gpus_reserved(cluster, queue) == "16", 30, what="16 GPUs reserved")
    cluster.kubectl("delete", "mj", "-n", ns, "toolarge", "running", "--wait=false")
    gone = [("mj", j) for j in names] + [("workloads.kueue.x-k8s.io", n) for n in names.values()]
    for kind, obj in gone:
        cluster.wait(
            lambda k=kind, o=obj: (
                cluster.kubectl("get", k, "-n", ns, o, check=False).returncode != 0
            ),
            30,
            what=f"{kind} {obj} gone (no finalizer stuck)",
        )
    # No finalizer: the job goes at once, and its pods follow (the operator's cleanup by uid,
    # or the garbage collector), each with its grace period.
    cluster.wait(lambda: pods(cluster, ns, "running") == [], 60, what="the job's pods gone")
    cluster.wait(lambda: gpus_reserved(cluster, queue) == "0", 30, what="the quota freed")


# The eviction reset's conflict handling ----------------------------------------------------
def test_the_eviction_reset_retries_after_a_concurrent_write(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    """Kueue writes the Workload status too: a reset built from a read that a write overtook gets
    409 from the apiserver, and `Queues.reset` reads again and retries."""

    ns = namespace
    # The owner of the Workload: suspended and unlabelled, so the operator leaves it alone.
    cluster.apply(tiny_gpu_job("owner", suspend=True), ns)
    raw_job = job(cluster, ns, "owner")
    doc = {k: raw_job[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    doc["metadata"]["labels"] = {kueue.LABEL_QUEUE_NAME: queue.local_queue}
    model = load_job(doc)
    body = kueue.render_workload(model, plan(model.spec))
    name = body["metadata"]["name"]
    queues = Queues(Kube(cluster.api_client()))
    queues.custom.create_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOAD_PLURAL, body
    )
    cluster.wait(
        lambda: (
            kueue.workload_state(queues.get(ns, name) or {}).phase is kueue.WorkloadPhase.ADMITTED
        ),
        30,
        what="admitted",
    )
    cluster.kubectl(
        "patch",
        "workloads.kueue.x-k8s.io",
        name,
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"active":false}}',
    )
    cluster.wait(
        lambda: (
            kueue.workload_state(queues.get(ns, name) or {}).phase is kueue.WorkloadPhase.EVICTED
        ),
        30,
        what="evicted",
    )

    overtaken = Overtaken(queues.kube)
    overtaken.reset(ns, name, kueue_now())
    assert overtaken.reads == 2, "the first patch was refused (409): the reset read again"
    after = queues.get(ns, name)
    assert after is not None and after["status"].get("admission") is None
    assert kueue.workload_state(after).phase is kueue.WorkloadPhase.PENDING


class Overtaken(Queues):
    """Queues whose first Workload read is overtaken by a write (as by Kueue) at once."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube)
        self.reads = 0

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        raw = super().get(namespace, name)
        self.reads += 1
        if self.reads == 1 and raw is not None:
            manager, applied = kueue.condition_apply(
                raw, kueue.pods_ready_condition(raw, all_ready=False, now=kueue_now())
            )
            self.custom.patch_namespaced_custom_object_status(
                kueue.GROUP,
                kueue.VERSION,
                namespace,
                kueue.WORKLOAD_PLURAL,
                name,
                applied,
                field_manager=manager,
                force=True,
                _content_type=APPLY_PATCH,
            )
        return raw


def kueue_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# Without Kueue ------------------------------------------------------------------------------
def test_without_kueue_a_queued_job_waits_and_kueue_on_refuses_to_start(
    cluster_factory: Any, tmp_path: Any
) -> None:
    """A job naming a LocalQueue never runs outside its quota: on a cluster without Kueue it
    waits with a condition saying why, and runs once the label is removed."""
    import subprocess
    import sys

    from .operator_support import install_crd

    bare = cluster_factory(nodes=2, kueue=False)
    install_crd(bare)
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", "operator", "--kueue", "on"],
        env=bare.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "does not serve kueue.x-k8s.io/v1beta2 Workloads" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr

    op = Op(bare, tmp_path)  # --kueue auto: finds no Kueue; labelled jobs wait
    op.start()
    try:
        bare.kubectl("create", "namespace", "plain")
        bare.apply(queued_job("plain"), "plain")
        st = wait_phase(bare, "plain", "plain", "Queued")
        admitted = next(c for c in st["conditions"] if c["type"] == "Admitted")
        assert (
            admitted["reason"] == "KueueDisabled"
            and "outside the queue's quota" in (admitted["message"])
        )
        assert bare.kubectl_json("get", "pods", "-n", "plain")["items"] == []
        assert "Kueue is not installed" in op.logs()
        bare.kubectl("label", "mj", "plain", "-n", "plain", "kueue.x-k8s.io/queue-name-")
        wait_pods(bare, "plain", "plain", 2, phase="Running")
        st = wait_phase(bare, "plain", "plain", "Running")
        assert "workload" not in st and "localQueue" not in st
    finally:
        op.stop()
    assert "Traceback" not in op.logs()


# RDMA, EFA and hugepages ----------------------------------------------------------------------
def test_rdma_and_hugepages_need_the_cluster_queue_to_cover_them(
    cluster: Cluster, namespace: str, queue: Queue
) -> None:
    """docs/kueue.md, "RDMA, EFA and hugepages": a job on a fabric asks Kueue for rdma/ib (and
    hugepages, as EFA does); a ClusterQueue that does not cover them never admits it, and says
    which; covering them (with quota) admits it."""
    ns = namespace
    fabric = queued_job(
        "fabric",
        resources={
            "network": {"fabric": "infiniband"},
            "requests": {"hugepages-2Mi": "1Gi", "memory": "2Gi", "cpu": "1"},
            "limits": {"hugepages-2Mi": "1Gi", "memory": "2Gi"},
        },
    )
    cluster.apply(fabric, ns)

    def refused() -> dict[str, Any] | None:
        admitted = condition(status(cluster, ns, "fabric"), "Admitted")
        text = str((admitted or {}).get("message", ""))
        return admitted if "rdma/ib" in text or "hugepages-2Mi" in text else None

    admitted = cluster.wait(refused, 60, what="Kueue's refusal naming the fabric's resources")
    assert status(cluster, ns, "fabric")["phase"] == "Queued" and pods(cluster, ns, "fabric") == []
    print(f"Kueue without rdma/ib and hugepages-2Mi covered: {admitted['message']}")
    cq = _cluster_queue(queue.cluster_queue, queue.flavor, ns, 16)
    group = cq["spec"]["resourceGroups"][0]
    group["coveredResources"] += ["rdma/ib", "hugepages-2Mi"]
    group["flavors"][0]["resources"] += [
        {"name": "rdma/ib", "nominalQuota": "1000"},
        {"name": "hugepages-2Mi", "nominalQuota": "1Ti"},
    ]
    cluster.apply(cq)
    wait_wl(cluster, ns, "fabric", "Admitted", ("True", "Admitted"))
    wl = workload(cluster, ns, "fabric")
    used = {
        r["name"]
        for ps in wl["status"]["admission"]["podSetAssignments"]
        for r in [{"name": k} for k in ps.get("resourceUsage", {})]
    }
    assert {"rdma/ib", "hugepages-2Mi", GPU} <= used, wl["status"]["admission"]
