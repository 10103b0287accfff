"""MultiKueue with real Kueue v0.19.2: a manager and two worker control planes
(`cluster up --multikueue-workers 2`), `mjob operator` against each of the three.

The manager has no nodes; its ClusterQueue names the MultiKueue admission check. Both workers have
a ClusterQueue of the same name, but only worker-2's has GPU quota. A MegatronJob with
`spec.managedBy: kueue.x-k8s.io/multikueue` applied on the manager:

- is dispatched to worker-2 (worker-1's copy of its Workload is removed) and runs there;
- its status (phase, progress, restarts) is mirrored back to the manager's object, and `kubectl
  get mj` on the manager prints it;
- deleting it on the manager deletes it (and its pods) on worker-2;
- at no point has the manager a pod, or any other child, of the job.

Also on the manager: a job another controller runs (`managedBy: example.com/...`) gets nothing,
and `spec.managedBy` cannot be changed (the CRD's transition rule).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from megatron_contract.paths import PROGRESS_ANNOTATION

from .conftest import Cluster, run_driver
from .operator_support import Op, install_crd, tiny_gpu_job

# One xdist worker for the module: its three control planes (a module fixture) are set up once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multikueue")]

MULTIKUEUE = "kueue.x-k8s.io/multikueue"
NS = "mk-team"
QUEUE = "gpus"
CQ = "mk-training"
CHECK = "megatron-multikueue"
GPU = "nvidia.com/gpu"


class MultiKueue:
    def __init__(self, manager: Cluster, workers: list[Cluster], ops: list[Op]) -> None:
        self.manager = manager
        self.workers = workers
        self.ops = ops
        self.manager_pods_seen: set[str] = set()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_manager_pods, daemon=True)
        self._watch.start()

    def _watch_manager_pods(self) -> None:
        """Samples the manager's pods all along: a pod there at any moment is a failure."""
        while not self._stop.wait(0.5):
            proc = self.manager.kubectl("get", "pods", "-A", "-o", "name", check=False)
            self.manager_pods_seen.update(proc.stdout.split())

    def stop(self) -> None:
        self._stop.set()
        self._watch.join(timeout=10)


def queues(gpus: int, admission_check: bool) -> list[dict[str, Any]]:
    cq: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": CQ},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory", GPU],
                    "flavors": [
                        {
                            "name": "mk-flavor",
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
    if admission_check:
        cq["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "mk-flavor"},
        },
        cq,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": NS},
            "spec": {"clusterQueue": CQ},
        },
    ]


@pytest.fixture(scope="module")
def mk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiKueue]:
    run_driver("build", timeout=3600)
    state = tmp_path_factory.mktemp("multikueue")
    out = run_driver(
        "up",
        "--state",
        str(state),
        "--multikueue-workers",
        "2",
        "--nodes",
        "2",
        "--nodes-per-rack",
        "2",
        "--pvs",
        "0",
        timeout=900,
    )
    lines = out.strip().splitlines()
    manager = Cluster(state_dir=state, info=json.loads((state / "cluster.json").read_text()))
    ops: list[Op] = []
    mk: MultiKueue | None = None
    workers: list[Cluster] = []
    try:
        assert re.fullmatch(r"KUBECONFIG=\S+", lines[-1]), lines
        kubeconfigs = dict(line.split("=", 1) for line in lines if "=" in line)
        assert lines[-1] == f"KUBECONFIG={manager.kubeconfig}"
        for i in (1, 2):
            wstate = state / "workers" / f"worker-{i}"
            info = json.loads((wstate / "cluster.json").read_text())
            assert kubeconfigs[f"WORKER_KUBECONFIG_{i}"] == info["kubeconfig"]
            workers.append(Cluster(state_dir=wstate, info=info, owned=False))
        assert [w["name"] for w in manager.info["multikueue"]["workers"]] == [
            "worker-1",
            "worker-2",
        ]
        assert manager.info["nodes"] == [] and all(len(w.nodes) == 2 for w in workers)
        for c, gpus, check in (
            (manager, 64, True),
            (workers[0], 0, False),
            (workers[1], 16, False),
        ):
            install_crd(c)
            c.kubectl("create", "namespace", NS)
            for obj in queues(gpus, check):
                c.apply(obj)
            op = Op(c, tmp_path_factory.mktemp("operator"))
            op.start()
            ops.append(op)
        mk = MultiKueue(manager, workers, ops)
        yield mk
    finally:
        if mk is not None:
            mk.stop()
        for op in ops:
            op.stop()
        for w in workers:
            w.down()  # not owned: closes its API connections only
        manager.down()
    for op in ops:
        assert "Traceback" not in op.logs(), op.logs()[-5000:]


def mj(cluster: Cluster, name: str) -> dict[str, Any] | None:
    proc = cluster.kubectl("get", "megatronjob", "-n", NS, name, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def workloads(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "workloads", "-n", NS)["items"]
    return items


def job_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", NS, "-l", f"megatron.dev/job-name={name}"
    )["items"]
    return items


def queued_job(name: str) -> dict[str, Any]:
    doc = tiny_gpu_job(name, nodes=2, managedBy=MULTIKUEUE)
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    return doc


def write_progress(cluster: Cluster, name: str, attempt: int, iteration: int) -> None:
    """What rank 0's trainer writes: its progress record on the job's Lease."""
    record = {
        "attempt": attempt,
        "iteration": iteration,
        "loss": 2.5,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    cluster.kubectl(
        "annotate",
        "lease",
        "-n",
        NS,
        f"{name}-progress",
        "--overwrite",
        f"{PROGRESS_ANNOTATION}={json.dumps(record)}",
    )


def test_dispatch_mirror_and_delete(mk: MultiKueue) -> None:
    manager, (w1, w2) = mk.manager, mk.workers
    name = "mk-run"
    manager.apply(queued_job(name), namespace=NS)

    # Dispatched to worker-2, the only worker with GPU quota; worker-1 keeps nothing of it.
    copy = manager.wait(lambda: mj(w2, name), 180, 1, "the job copied to worker-2")
    assert "managedBy" not in copy["spec"], "MultiKueue removes managedBy on the worker"
    # Kueue 0.19 names the Workload copy in an annotation (WorkloadIdentifierAnnotations).
    wl_name = copy["metadata"]["annotations"]["kueue.x-k8s.io/prebuilt-workload-name"]
    assert copy["metadata"]["labels"]["kueue.x-k8s.io/multikueue-origin"] == "multikueue"
    running = manager.wait(
        lambda: (
            [p for p in job_pods(w2, name) if p["status"].get("phase") == "Running"]
            if len(job_pods(w2, name)) == 2
            else None
        ),
        120,
        1,
        "2 Running pods on worker-2",
    )
    assert {p["spec"]["nodeName"] for p in running} <= set(w2.nodes)
    wl2 = next(w for w in workloads(w2) if w["metadata"]["name"] == wl_name)
    owner = wl2["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "MegatronJob",
        copy["metadata"]["uid"],
        True,
    ), "the worker's operator took over the prebuilt Workload"
    manager.wait(lambda: not workloads(w1) and mj(w1, name) is None, 60, 1, "worker-1 cleared")
    wl_m = next(w for w in workloads(manager) if w["metadata"]["name"] == wl_name)
    assert wl_m["status"].get("clusterName") == "worker-2"

    # The manager's object tells the truth: the worker's status, mirrored.
    def manager_phase(phase: str) -> dict[str, Any] | None:
        st = (mj(manager, name) or {}).get("status") or {}
        return st if st.get("phase") == phase else None

    st = manager.wait(lambda: manager_phase("Running"), 120, 1, "Running on the manager")
    assert st["workload"] == wl_name and st["restarts"] == 0
    table = manager.kubectl("get", "mj", "-n", NS, name).stdout
    assert re.search(rf"^{name}\s+Running\s+\S+\s+16\s+0\s", table, re.M), table

    def pods_ready() -> bool:
        wl = next(w for w in workloads(manager) if w["metadata"]["name"] == wl_name)
        conds = wl["status"].get("conditions") or []
        return any(c["type"] == "PodsReady" and c["status"] == "True" for c in conds)

    # The manager's Workload reports PodsReady from the mirror (else waitForPodsReady evicts it).
    manager.wait(pods_ready, 60, 1, "PodsReady on the manager's Workload")

    write_progress(w2, name, attempt=0, iteration=37)
    st = manager.wait(
        lambda: (
            (s := (mj(manager, name) or {}).get("status") or {})
            .get("progress", {})
            .get("iteration")
            == 37
            and s
        ),
        120,
        1,
        "progress mirrored to the manager",
    )
    assert st["progressSummary"].startswith("37/")

    # A rank fails on the worker: the gang restarts there, and the manager shows the restart.
    victim = sorted(p["metadata"]["name"] for p in running)[0]
    w2.fail_pod(NS, victim)
    st = manager.wait(
        lambda: (
            (s := (mj(manager, name) or {}).get("status") or {}).get("restarts") == 1
            and s.get("phase") == "Running"
            and s
        ),
        180,
        1,
        "restarts: 1 and Running again, on the manager",
    )
    assert st["lastFailure"]["pod"] == victim
    table = manager.kubectl("get", "mj", "-n", NS, name).stdout
    assert re.search(rf"^{name}\s+Running\s+\S+\s+16\s+1\s", table, re.M), table

    # Deleting it on the manager deletes it on the worker, with its pods and Workloads.
    manager.kubectl("delete", "mj", "-n", NS, name, "--wait=true")
    manager.wait(
        lambda: mj(w2, name) is None and not job_pods(w2, name), 120, 1, "the worker's copy gone"
    )
    manager.wait(lambda: not workloads(manager) and not workloads(w2), 60, 1, "Workloads gone")
    assert not mk.manager_pods_seen, f"pods on the manager: {sorted(mk.manager_pods_seen)}"
    for kind in ("configmaps", "services", "persistentvolumeclaims", "leases"):
        items = manager.kubectl_json("get", kind, "-n", NS, "-l", f"megatron.dev/job-name={name}")
        assert items["items"] == [], f"a {kind} child on the manager"


def test_a_job_another_controller_runs_gets_nothing(mk: MultiKueue) -> None:
    manager = mk.manager
    name = "mk-foreign"
    doc = tiny_gpu_job(name, managedBy="example.com/other-controller")
    manager.apply(doc, namespace=NS)
    time.sleep(8)  # several reconcile opportunities
    job = mj(manager, name)
    assert job is not None and not job.get("status"), "no status written"
    assert job_pods(manager, name) == [] and not workloads(manager)
    items = manager.kubectl_json(
        "get", "configmaps", "-n", NS, "-l", f"megatron.dev/job-name={name}"
    )
    assert items["items"] == []
    assert "leaving it alone" in mk.ops[0].logs()

    # managedBy is immutable: the apiserver refuses a change (the CRD's transition rule).
    proc = manager.kubectl(
        "patch",
        "mj",
        "-n",
        NS,
        name,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"managedBy": "megatron.dev/operator"}}),
        check=False,
    )
    assert proc.returncode != 0 and "spec.managedBy is immutable" in proc.stderr, proc.stderr
    manager.kubectl("delete", "mj", "-n", NS, name)
