"""The Kueue protocol data of core/kueue.py against the real Kueue controller (v0.19, `cluster up
--kueue`), with no operator running: this test plays the operator's part by hand, step by step,
so each piece of data (the rendered Workload, the admission read back, the pods merged with the
flavor, the PodsReady/Finished conditions, the eviction reset) is checked against what Kueue itself
does with it.

Strategy: every test gets a fresh namespace plus its own ResourceFlavor, ClusterQueue (16 GPUs)
and LocalQueue (cluster-scoped names are unique per test). The MegatronJobs exist only to own the
Workloads (Kueue finishes orphaned Workloads, and the garbage collector deletes Workloads whose
owner is gone); nothing reconciles them. Pods are created from the renderer's output, merged by
`admission_pod_patch`, and kwok runs them on the fake GPU nodes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from megatron_operator.api import load_job
from megatron_operator.api.job import MegatronJob
from megatron_operator.core import kueue
from megatron_operator.core.kueue import QueuedState, WorkloadPhase
from megatron_operator.core.planner import plan
from megatron_operator.core.render import render

from .conftest import Cluster
from .operator_support import install_crd, tiny_gpu_job

pytestmark = pytest.mark.timeout(300)

GPU = "nvidia.com/gpu"
TAINT_KEY = "megatron.dev/kueue-test"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass
class Queue:
    flavor: str
    cluster_queue: str
    local_queue: str
    namespace: str
    zone: str


@pytest.fixture
def custom(cluster: Cluster) -> Any:
    import kubernetes

    if not cluster.kueue:
        pytest.fail(
            "this test needs Kueue: run the cluster with --kueue (MEGATRON_CLUSTER_KUEUE=1)"
        )
    install_crd(cluster)
    return kubernetes.client.CustomObjectsApi(cluster.api_client())


@pytest.fixture
def queue(cluster: Cluster, custom: Any, namespace: str) -> Iterator[Queue]:
    """A ResourceFlavor for one zone's nodes (with a toleration it adds to pods), a ClusterQueue
    of 16 GPUs on it, and a LocalQueue in the test's namespace."""
    suffix = uuid.uuid4().hex[:6]
    zone = "zone-a"
    q = Queue(f"rf-{suffix}", f"cq-{suffix}", "gpus", namespace, zone)
    flavor = {
        "apiVersion": kueue.API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": q.flavor},
        "spec": {
            "nodeLabels": {cluster.zone_key: zone},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    cq = {
        "apiVersion": kueue.API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": q.cluster_queue},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            # Equal priorities never preempt each other; only the preemption test differs.
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": q.flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "1000"},
                                {"name": "memory", "nominalQuota": "16Ti"},
                                {"name": GPU, "nominalQuota": "16"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    lq = {
        "apiVersion": kueue.API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": q.local_queue, "namespace": namespace},
        "spec": {"clusterQueue": q.cluster_queue},
    }
    for obj in (flavor, cq, lq):
        cluster.apply(obj)
    cluster.wait(
        lambda: _active(cluster, "clusterqueue", q.cluster_queue),
        timeout=30,
        what=f"ClusterQueue {q.cluster_queue} Active",
    )
    try:
        yield q
    finally:
        # Pods first (they hold GPUs on the shared cluster), then Kueue's objects.
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl(
            "delete",
            "workloads.kueue.x-k8s.io",
            "--all",
            "-n",
            namespace,
            "--wait=false",
            check=False,
        )
        cluster.kubectl(
            "delete", "localqueue", q.local_queue, "-n", namespace, "--wait=false", check=False
        )
        cluster.kubectl("delete", "clusterqueue", q.cluster_queue, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", q.flavor, "--wait=false", check=False)


def _active(cluster: Cluster, kind: str, name: str) -> bool:
    obj = cluster.kubectl_json("get", kind, name)
    return any(
        c.get("type") == "Active" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


# -- the operator's part, by hand -------------------------------------------------------------


def create_job(
    custom: Any,
    ns: str,
    name: str,
    queue: str,
    labels: dict[str, str] | None = None,
    nodes: int = 2,
    **spec: Any,
) -> MegatronJob:
    """A MegatronJob with the queue label, read back (for its uid) as the model."""
    doc = tiny_gpu_job(name, nodes=nodes, **spec)
    doc["metadata"]["labels"] = {kueue.LABEL_QUEUE_NAME: queue, **(labels or {})}
    created = custom.create_namespaced_custom_object(
        "megatron.dev", "v1alpha1", ns, "megatronjobs", doc
    )
    job = load_job({k: created[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    assert job.metadata.uid
    return job


def create_workload(custom: Any, job: MegatronJob, priority: int | None = None) -> str:
    body = kueue.render_workload(job, plan(job.spec), priority)
    custom.create_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, job.namespace, kueue.WORKLOAD_PLURAL, body
    )
    return str(body["metadata"]["name"])


def read_workload(custom: Any, ns: str, name: str) -> dict[str, Any]:
    raw: dict[str, Any] = custom.get_namespaced_custom_object(
        kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOAD_PLURAL, name
    )
    return raw


def wait_phase(
    cluster: Cluster, custom: Any, ns: str, name: str, phase: WorkloadPhase, timeout: float = 30
) -> QueuedState:
    def check() -> QueuedState | None:
        state = kueue.workload_state(read_workload(custom, ns, name))
        return state if state.phase is phase else None

    result: QueuedState = cluster.wait(check, timeout=timeout, what=f"Workload {name} {phase}")
    return result


def apply_condition(custom: Any, raw: dict[str, Any], cond: dict[str, Any]) -> None:
    """Server-side apply of our one condition to /status, with our own field manager."""
    manager, body = kueue.condition_apply(raw, cond)
    meta = raw["metadata"]
    custom.patch_namespaced_custom_object_status(
        kueue.GROUP,
        kueue.VERSION,
        meta["namespace"],
        kueue.WORKLOAD_PLURAL,
        meta["name"],
        body,
        field_manager=manager,
        force=True,
        _content_type=APPLY,
    )


def start_pods(cluster: Cluster, custom: Any, job: MegatronJob, state: QueuedState) -> list[str]:
    """What the operator does on Admitted=True: the job's children, then its pods merged with
    the admitted flavors. Returns the pod names."""
    flavors = {
        name: custom.get_cluster_custom_object(kueue.GROUP, kueue.VERSION, "resourceflavors", name)
        for name in state.flavors
    }
    assignment = state.assignment(kueue.PODSET_TRAINER)
    objs = render(job, plan(job.spec), attempt=0)
    names = []
    for obj in objs:
        if obj["kind"] != "Pod":
            cluster.apply(obj)
            continue
        merged = kueue.admission_pod_patch(
            obj,
            assignment,
            flavors,
            state.updates_for(assignment.name),
            state.tas_for(assignment.name),
        )
        names.append(merged["metadata"]["name"])
        cluster.apply(merged)
    return names


def wait_running(cluster: Cluster, ns: str, names: list[str]) -> list[dict[str, Any]]:
    return [cluster.wait_pod_phase(ns, n, "Running", timeout=60) for n in names]


def all_ready(cluster: Cluster, ns: str, names: list[str]) -> bool:
    return all(
        any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in cluster.pod(ns, n).get("status", {}).get("conditions", [])
        )
        for n in names
    )


def delete_pods(cluster: Cluster, ns: str, names: list[str]) -> None:
    """Stop the pods (SIGTERM and the grace period) and wait until none is left."""
    cluster.kubectl("delete", "pod", "-n", ns, *names, "--wait=true", "--timeout=60s")


def reset_after_eviction(custom: Any, ns: str, name: str) -> dict[str, Any]:
    """The eviction reset as a JSON merge patch on /status; returns the Workload after it."""
    raw = read_workload(custom, ns, name)
    custom.patch_namespaced_custom_object_status(
        kueue.GROUP,
        kueue.VERSION,
        ns,
        kueue.WORKLOAD_PLURAL,
        name,
        kueue.eviction_reset_patch(raw, now()),
        _content_type=MERGE,
    )
    return read_workload(custom, ns, name)


def cq_status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "clusterqueue", name).get("status") or {})


def wait_cq_count(cluster: Cluster, q: Queue, counter: str, want: int) -> None:
    """The ClusterQueue's `counter` reaches `want`. Kueue writes its counters a moment after the
    Workload's own conditions, so they are awaited, never read once (CI once read 0 here)."""
    cluster.wait(
        lambda: cq_status(cluster, q.cluster_queue).get(counter) == want,
        timeout=30,
        what=f"{counter} == {want} in {q.cluster_queue}",
    )


def wait_gpus_reserved(cluster: Cluster, q: Queue, want: str) -> None:
    """The ClusterQueue's status (written by Kueue a moment after admission) shows `want`."""
    cluster.wait(
        lambda: gpus_reserved(cluster, q) == want,
        timeout=30,
        what=f"{want} GPUs reserved in {q.cluster_queue} (now {gpus_reserved(cluster, q)})",
    )


def gpus_reserved(cluster: Cluster, q: Queue) -> str:
    for flavor in cq_status(cluster, q.cluster_queue).get("flavorsReservation") or []:
        if flavor.get("name") == q.flavor:
            for res in flavor.get("resources") or []:
                if res.get("name") == GPU:
                    return str(res.get("total"))
    return "0"


def now() -> datetime:
    return datetime.now(UTC)


# -- the tests --------------------------------------------------------------------------------


def test_second_job_waits_for_quota_until_the_first_finishes(
    cluster: Cluster, custom: Any, queue: Queue, namespace: str
) -> None:
    ns = namespace
    first = create_job(custom, ns, "first", queue.local_queue)
    second = create_job(custom, ns, "second", queue.local_queue)

    wl_first = create_workload(custom, first)
    # The Workload as stored (schema defaults added) still matches what we render.
    stored = read_workload(custom, ns, wl_first)
    assert kueue.workload_outdated(stored, kueue.render_workload(first, plan(first.spec))) == []
    assert stored["metadata"].get("finalizers") is None, "we add no finalizer to free later"
    admitted = wait_phase(cluster, custom, ns, wl_first, WorkloadPhase.ADMITTED)
    assert admitted.cluster_queue == queue.cluster_queue
    assert admitted.flavors == (queue.flavor,)
    assert admitted.assignment(kueue.PODSET_TRAINER).count == 2
    assert dict(admitted.assignment(kueue.PODSET_TRAINER).flavors)[GPU] == queue.flavor
    wait_gpus_reserved(cluster, queue, "16")

    # The second asks for 16 more GPUs than are left: Kueue says so, and we can copy its words.
    wl_second = create_workload(custom, second)
    pending = cluster.wait(
        lambda: (s := kueue.workload_state(read_workload(custom, ns, wl_second))).message and s,
        timeout=30,
        what="Kueue's pending message",
    )
    assert pending.phase is WorkloadPhase.PENDING, pending
    assert GPU in pending.message and "quota" in pending.message, pending.message

    # Pods of the admitted job: the flavor's node labels and tolerations are on them, and the
    # real scheduler puts them only on nodes of that flavor.
    names = start_pods(cluster, custom, first, admitted)
    zone_nodes = {
        n["metadata"]["name"]
        for n in cluster.kubectl_json("get", "nodes", "-l", f"{cluster.zone_key}={queue.zone}")[
            "items"
        ]
    }
    for p in wait_running(cluster, ns, names):
        assert p["spec"]["nodeSelector"][cluster.zone_key] == queue.zone
        assert {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in p["spec"][
            "tolerations"
        ]
        assert p["metadata"]["labels"][kueue.LABEL_PODSET] == kueue.PODSET_TRAINER
        assert p["spec"]["nodeName"] in zone_nodes

    # PodsReady: WaitForStart, then Started once kwok has made every pod Ready.
    raw = read_workload(custom, ns, wl_first)
    apply_condition(custom, raw, kueue.pods_ready_condition(raw, all_ready=False, now=now()))
    cluster.wait(lambda: all_ready(cluster, ns, names), timeout=30, what="pods Ready")
    raw = read_workload(custom, ns, wl_first)
    waiting = kueue.find_condition(raw, "PodsReady")
    assert waiting is not None and waiting["reason"] == "WaitForStart"
    apply_condition(custom, raw, kueue.pods_ready_condition(raw, all_ready=True, now=now()))
    ready = kueue.find_condition(read_workload(custom, ns, wl_first), "PodsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Started")
    # Still admitted, and the second still waits.
    assert kueue.workload_state(read_workload(custom, ns, wl_first)).phase is WorkloadPhase.ADMITTED
    assert kueue.workload_state(read_workload(custom, ns, wl_second)).phase is WorkloadPhase.PENDING

    # The first succeeds: its pods complete, Finished=True/Succeeded frees the quota, and Kueue
    # admits the second.
    for n in names:
        cluster.complete_pod(ns, n)
    raw = read_workload(custom, ns, wl_first)
    apply_condition(custom, raw, kueue.finished_condition(raw, True, "training finished", now()))
    done = wait_phase(cluster, custom, ns, wl_first, WorkloadPhase.FINISHED)
    assert done.reason == "Succeeded"
    second_admitted = wait_phase(cluster, custom, ns, wl_second, WorkloadPhase.ADMITTED)
    assert second_admitted.flavors == (queue.flavor,)
    wait_cq_count(cluster, queue, "admittedWorkloads", 1)


def test_deactivation_evicts_and_the_reset_releases_the_quota(
    cluster: Cluster, custom: Any, queue: Queue, namespace: str
) -> None:
    ns = namespace
    running = create_job(custom, ns, "running", queue.local_queue)
    waiting = create_job(custom, ns, "waiting", queue.local_queue)
    wl_running = create_workload(custom, running)
    state = wait_phase(cluster, custom, ns, wl_running, WorkloadPhase.ADMITTED)
    names = start_pods(cluster, custom, running, state)
    wait_running(cluster, ns, names)
    wl_waiting = create_workload(custom, waiting)
    cluster.wait(
        lambda: kueue.workload_state(read_workload(custom, ns, wl_waiting)).message,
        timeout=30,
        what="the second Workload pending",
    )

    # Deactivate: Kueue marks it Evicted. Kueue v0.19 drops a deactivated Workload from its
    # quota cache at once (workload_controller: `!active` deletes it from the cache), so the
    # waiting Workload is admitted while the evicted job's pods may still be stopping; the
    # kube-scheduler keeps the new pods Pending until the old ones have released the GPUs.
    custom.patch_namespaced_custom_object(
        kueue.GROUP,
        kueue.VERSION,
        ns,
        kueue.WORKLOAD_PLURAL,
        wl_running,
        {"spec": {"active": False}},
        _content_type=MERGE,
    )
    evicted = wait_phase(cluster, custom, ns, wl_running, WorkloadPhase.EVICTED)
    assert evicted.reason == "Deactivated", evicted
    assert not evicted.active
    wait_phase(cluster, custom, ns, wl_waiting, WorkloadPhase.ADMITTED)

    # The operator's part all the same: stop the pods, wait until none is live, then reset the
    # status, which clears the stale admission and records why it was not requeued.
    delete_pods(cluster, ns, names)
    after = reset_after_eviction(custom, ns, wl_running)
    assert after["status"].get("admission") is None
    reset = kueue.workload_state(after)
    assert reset.phase is WorkloadPhase.PENDING and not reset.active
    requeued = kueue.find_condition(after, "Requeued")
    assert requeued is not None and (requeued["status"], requeued["reason"]) == (
        "False",
        "Deactivated",
    )
    admitted = kueue.find_condition(after, "Admitted")
    assert admitted is not None and (admitted["status"], admitted["reason"]) == (
        "False",
        "NoReservation",
    )
    # Only the waiting job holds quota now.
    wait_cq_count(cluster, queue, "reservingWorkloads", 1)
    wait_gpus_reserved(cluster, queue, "16")


def test_a_stale_eviction_reset_is_refused(
    cluster: Cluster, custom: Any, queue: Queue, namespace: str
) -> None:
    """The reset replaces the whole conditions list, so it must not overwrite a write it has not
    seen: with the old resourceVersion the API server answers 409."""
    from kubernetes.client.exceptions import ApiException

    ns = namespace
    job = create_job(custom, ns, "stale", queue.local_queue)
    wl = create_workload(custom, job)
    wait_phase(cluster, custom, ns, wl, WorkloadPhase.ADMITTED)
    custom.patch_namespaced_custom_object(
        kueue.GROUP,
        kueue.VERSION,
        ns,
        kueue.WORKLOAD_PLURAL,
        wl,
        {"spec": {"active": False}},
        _content_type=MERGE,
    )
    wait_phase(cluster, custom, ns, wl, WorkloadPhase.EVICTED)
    raw = read_workload(custom, ns, wl)
    patch = kueue.eviction_reset_patch(raw, now())
    apply_condition(custom, raw, kueue.pods_ready_condition(raw, all_ready=False, now=now()))
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object_status(
            kueue.GROUP, kueue.VERSION, ns, kueue.WORKLOAD_PLURAL, wl, patch, _content_type=MERGE
        )
    assert err.value.status == 409
    assert kueue.workload_state(read_workload(custom, ns, wl)).phase is WorkloadPhase.EVICTED


@pytest.fixture
def priorities(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Two WorkloadPriorityClasses (low 100, high 1000), cluster-scoped, unique names."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"low-{suffix}", f"high-{suffix}")
    for name, value in zip(names, (100, 1000), strict=True):
        cluster.apply(
            {
                "apiVersion": kueue.API_VERSION,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )
    try:
        yield names
    finally:
        for name in names:
            cluster.kubectl("delete", "workloadpriorityclass", name, "--wait=false", check=False)


def test_preemption_evicts_the_lower_priority_job_and_requeues_it(
    cluster: Cluster, custom: Any, queue: Queue, namespace: str, priorities: tuple[str, str]
) -> None:
    ns = namespace
    low_class, high_class = priorities
    low = create_job(custom, ns, "low", queue.local_queue, {kueue.LABEL_PRIORITY_CLASS: low_class})
    high = create_job(
        custom, ns, "high", queue.local_queue, {kueue.LABEL_PRIORITY_CLASS: high_class}
    )
    wl_low = create_workload(custom, low, priority=100)
    state = wait_phase(cluster, custom, ns, wl_low, WorkloadPhase.ADMITTED)
    names = start_pods(cluster, custom, low, state)
    wait_running(cluster, ns, names)

    # The higher-priority job needs the whole queue: Kueue preempts the running one.
    wl_high = create_workload(custom, high, priority=1000)
    evicted = wait_phase(cluster, custom, ns, wl_low, WorkloadPhase.EVICTED)
    assert evicted.reason == "Preempted", evicted
    preempted = kueue.find_condition(read_workload(custom, ns, wl_low), "Preempted")
    assert preempted is not None and preempted["status"] == "True"
    # The preemptor waits for the quota, which the evicted job holds until its pods are gone.
    assert kueue.workload_state(read_workload(custom, ns, wl_high)).phase is WorkloadPhase.PENDING

    delete_pods(cluster, ns, names)
    after = reset_after_eviction(custom, ns, wl_low)
    requeued = kueue.find_condition(after, "Requeued")
    assert requeued is not None and (requeued["status"], requeued["reason"]) == (
        "True",
        "Preempted",
    )
    assert kueue.workload_state(after).active  # preempted, not deactivated: it queues again

    high_state = wait_phase(cluster, custom, ns, wl_high, WorkloadPhase.ADMITTED)
    assert high_state.flavors == (queue.flavor,)
    low_state = kueue.workload_state(read_workload(custom, ns, wl_low))
    assert low_state.phase is WorkloadPhase.PENDING


@pytest.fixture
def tas_queue(cluster: Cluster, custom: Any, namespace: str) -> Iterator[Queue]:
    """Topology-aware scheduling: a Kueue Topology over the rack label and the hostname, a
    ResourceFlavor using it for one zone's nodes (two racks), a ClusterQueue of 32 GPUs."""
    suffix = uuid.uuid4().hex[:6]
    zone = "zone-b"
    q = Queue(f"tas-{suffix}", f"cq-tas-{suffix}", "tas", namespace, zone)
    topology = f"racks-{suffix}"
    objs: list[dict[str, Any]] = [
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "Topology",
            "metadata": {"name": topology},
            "spec": {
                "levels": [{"nodeLabel": cluster.rack_key}, {"nodeLabel": "kubernetes.io/hostname"}]
            },
        },
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": q.flavor},
            "spec": {"nodeLabels": {cluster.zone_key: zone}, "topologyName": topology},
        },
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": q.cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": q.flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "16Ti"},
                                    {"name": GPU, "nominalQuota": "32"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": kueue.API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": q.local_queue, "namespace": namespace},
            "spec": {"clusterQueue": q.cluster_queue},
        },
    ]
    for obj in objs:
        cluster.apply(obj)
    cluster.wait(
        lambda: _active(cluster, "clusterqueue", q.cluster_queue),
        timeout=30,
        what=f"ClusterQueue {q.cluster_queue} Active",
    )
    try:
        yield q
    finally:
        cluster.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        cluster.kubectl(
            "delete",
            "workloads.kueue.x-k8s.io",
            "--all",
            "-n",
            namespace,
            "--wait=false",
            check=False,
        )
        cluster.kubectl(
            "delete", "localqueue", q.local_queue, "-n", namespace, "--wait=false", check=False
        )
        cluster.kubectl("delete", "clusterqueue", q.cluster_queue, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceflavor", q.flavor, "--wait=false", check=False)
        cluster.kubectl("delete", "topology", topology, "--wait=false", check=False)


def test_tas_ungates_the_pods_into_one_rack_in_rank_order(
    cluster: Cluster, custom: Any, tas_queue: Queue, namespace: str
) -> None:
    ns = namespace
    q = tas_queue
    # A whole rack (4 nodes): the four ranks must share one, wherever Kueue finds it free.
    job = create_job(
        custom,
        ns,
        "packed",
        q.local_queue,
        nodes=4,
        topology={"key": cluster.rack_key, "mode": "required"},
    )
    wl = create_workload(custom, job)
    state = wait_phase(cluster, custom, ns, wl, WorkloadPhase.ADMITTED)
    assignment = state.assignment(kueue.PODSET_TRAINER)
    assert assignment.topology_assignment is not None, state
    tas = state.tas_for(kueue.PODSET_TRAINER)
    assert tas is not None and tas.request == {
        "required": cluster.rack_key,
        "podIndexLabel": "megatron.dev/node-rank",
    }
    slots = kueue.topology_slots(assignment.topology_assignment)
    assert len(slots) == 4

    names = start_pods(cluster, custom, job, state)
    # Kueue's ungater removes the gate and pins each rank to its slot's node.
    running = wait_running(cluster, ns, names)
    nodes = {n["metadata"]["name"]: n for n in cluster.kubectl_json("get", "nodes")["items"]}
    racks = set()
    for p in running:
        rank = int(p["metadata"]["labels"]["megatron.dev/node-rank"])
        assert not p["spec"].get("schedulingGates"), p["spec"].get("schedulingGates")
        assert p["metadata"]["annotations"][kueue.ANNOTATION_REQUIRED_TOPOLOGY] == cluster.rack_key
        labels = nodes[p["spec"]["nodeName"]]["metadata"]["labels"]
        for key, value in slots[rank].items():
            # Rank r is pinned to slot r (podIndexLabel), and the scheduler honoured it.
            assert p["spec"]["nodeSelector"][key] == value
            assert labels[key] == value
        assert labels[cluster.zone_key] == q.zone
        racks.add(labels[cluster.rack_key])
    assert len(racks) == 1, racks
