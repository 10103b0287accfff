"""Multi-tenant object safety on the real control plane (issue 15; docs/security.md).

Foreign objects under a child's name are never modified, adopted or deleted; a created
checkpoint claim outlives its job unless the spec says Delete; jobs carry no finalizer, so
deleting one completes while the operator is down; pod deletes carry the pod's uid; and the
rendered pods of the examples pass the `restricted` Pod Security level.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api

from megatron_operator.api import load_file
from megatron_operator.cluster.kube import Kube
from megatron_operator.core.planner import plan
from megatron_operator.core.render import children
from megatron_operator.core.render import pods as render_pods

from .conftest import REPO, Cluster
from .operator_support import (
    Op,
    condition,
    events,
    install_crd,
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)


@pytest.fixture(scope="module")
def op(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Op]:
    """Our own operator process: one test here stops and starts it."""
    install_crd(cluster)
    operator = Op(cluster, tmp_path_factory.mktemp("operator-security"))
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()
        assert "Traceback" not in operator.logs(), operator.logs()[-5000:]


def _exists(cluster: Cluster, ns: str, kind: str, name: str) -> bool:
    return cluster.kubectl("get", kind, "-n", ns, name, check=False).returncode == 0


def _foreign(kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    api = "rbac.authorization.k8s.io/v1" if kind == "Role" else "v1"
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, **body}


def test_foreign_children_are_never_touched(cluster: Cluster, namespace: str, op: Op) -> None:
    ns, name = namespace, "taken"
    foreign = {
        ("serviceaccount", f"{name}-trainer"): _foreign("ServiceAccount", f"{name}-trainer", {}),
        ("role", f"{name}-trainer"): _foreign(
            "Role",
            f"{name}-trainer",
            {"rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]},
        ),
        ("configmap", f"{name}-config"): _foreign(
            "ConfigMap", f"{name}-config", {"data": {"mine": "yes"}}
        ),
        # carries the job's label too: still not the job's pod
        ("pod", f"{name}-a0-0"): {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-a0-0", "labels": {"megatron.dev/job-name": name}},
            "spec": {"containers": [{"name": "c", "image": "someone:else"}]},
        },
    }
    for obj in foreign.values():
        cluster.apply(obj, ns)
    before = {
        key: cluster.kubectl_json("get", key[0], "-n", ns, key[1])["metadata"] for key in foreign
    }
    cluster.apply(tiny_gpu_job(name, nodes=2), ns)

    def conflict_names(kind: str) -> dict[str, Any] | None:
        cond = condition(status(cluster, ns, name), "ChildrenOwned")
        ok = cond is not None and cond["status"] == "False" and cond["reason"] == "ChildConflict"
        return cond if ok and cond["message"].startswith(kind) else None

    cond = cluster.wait(lambda: conflict_names("ServiceAccount"), 30, what="the conflict")
    assert f"ServiceAccount {name}-trainer already exists" in cond["message"]
    assert "Delete or rename" in cond["message"]
    assert status(cluster, ns, name).get("phase") in (None, "Pending")
    assert [p["metadata"]["name"] for p in pods(cluster, ns, name)] == [f"{name}-a0-0"]
    warnings = [e for e in events(cluster, ns, name) if e["reason"] == "ChildConflict"]
    assert warnings and warnings[0]["type"] == "Warning"

    def untouched() -> None:
        for (kind, obj_name), meta in before.items():
            now = cluster.kubectl_json("get", kind, "-n", ns, obj_name)["metadata"]
            assert now["uid"] == meta["uid"], f"{kind} {obj_name} was replaced"
            assert now.get("ownerReferences") == meta.get("ownerReferences"), f"{kind} adopted"
            if kind != "pod":  # a pod's status moves (kwok runs it); its spec cannot
                assert now["resourceVersion"] == meta["resourceVersion"], f"{kind} modified"

    time.sleep(3)
    untouched()
    # One by one, each removal moves the conflict to the next foreign object.
    for kind, next_kind in (
        ("serviceaccount", "Role"),
        ("role", "ConfigMap"),
        ("configmap", "Pod"),
    ):
        key = next(k for k in before if k[0] == kind)
        cluster.kubectl("delete", kind, "-n", ns, key[1])
        del before[key]
        cluster.wait(lambda k=next_kind: conflict_names(k), 40, what=f"conflict on {next_kind}")
        untouched()
    # The foreign pod is not one of the job's: the job waits on it, never deletes it.
    assert _exists(cluster, ns, "pod", f"{name}-a0-0")
    cluster.kubectl("delete", "pod", "-n", ns, f"{name}-a0-0", "--grace-period=0", "--force")
    st = wait_phase(cluster, ns, name, "Running", timeout=60)
    cond = condition(st, "ChildrenOwned")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "ChildrenCreated")
    sa = cluster.kubectl_json("get", "serviceaccount", "-n", ns, f"{name}-trainer")
    assert (
        sa["metadata"]["ownerReferences"][0]["uid"]
        == cluster.kubectl_json("get", "mj", "-n", ns, name)["metadata"]["uid"]
    )


def _finish(cluster: Cluster, ns: str, name: str) -> None:
    """Complete the job's pod without waiting to see it Succeeded: with a TTL of 1 s the job and
    its pod can be gone (deleted, then collected) before a loaded machine's first look."""
    for p in wait_pods(cluster, ns, name, 1, phase="Running"):
        cluster.complete_pod(ns, p["metadata"]["name"], wait=False)


def test_ttl_keeps_the_created_claim_and_a_new_job_of_that_name_reuses_it(
    cluster: Cluster, namespace: str, op: Op
) -> None:
    ns, name = namespace, "kept"
    cluster.apply(tiny_gpu_job(name, nodes=1, ttlSecondsAfterFinished=1), ns)
    _finish(cluster, ns, name)
    claim = cluster.kubectl_json("get", "pvc", "-n", ns, f"{name}-checkpoints")["metadata"]
    cluster.wait(lambda: not _exists(cluster, ns, "mj", name), 60, what="TTL deleting the job")
    # the job's owned children go (the operator's cleanup, or the garbage collector) ...
    cluster.wait(
        lambda: not _exists(cluster, ns, "configmap", f"{name}-config"), 45, what="children gone"
    )
    # ... and the claim with its checkpoints stays, labelled with the job that made it
    time.sleep(2)
    kept = cluster.kubectl_json("get", "pvc", "-n", ns, f"{name}-checkpoints")["metadata"]
    assert kept["uid"] == claim["uid"] and not kept.get("deletionTimestamp")
    assert kept["labels"]["megatron.dev/job-name"] == name
    # A job re-created under the same name resumes from the same claim (no conflict).
    cluster.apply(tiny_gpu_job(name, nodes=1), ns)
    wait_phase(cluster, ns, name, "Running", timeout=60)
    again = cluster.kubectl_json("get", "pvc", "-n", ns, f"{name}-checkpoints")["metadata"]
    assert again["uid"] == claim["uid"]
    volumes = pods(cluster, ns, name)[0]["spec"]["volumes"]
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    ]
    assert claims == [f"{name}-checkpoints"]


def test_ttl_with_when_deleted_delete_removes_the_claim(
    cluster: Cluster, namespace: str, op: Op
) -> None:
    ns, name = namespace, "dropped"
    volume = {"create": {"size": "1Gi", "retentionPolicy": {"whenDeleted": "Delete"}}}
    doc = tiny_gpu_job(name, nodes=1, ttlSecondsAfterFinished=1, checkpoint={"volume": volume})
    cluster.apply(doc, ns)
    _finish(cluster, ns, name)
    cluster.wait(lambda: not _exists(cluster, ns, "mj", name), 60, what="TTL deleting the job")
    cluster.wait(
        lambda: not _exists(cluster, ns, "pvc", f"{name}-checkpoints"), 60, what="claim deleted"
    )


def test_deleting_a_job_completes_while_the_operator_is_down(
    cluster: Cluster, namespace: str, op: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("orphan", nodes=1), ns)
    wait_phase(cluster, ns, "orphan", "Running")
    # A job an older operator version gave its finalizer, made while this one is down.
    old = tiny_gpu_job("legacy", nodes=1)
    old["metadata"]["finalizers"] = ["megatron.dev/cleanup"]
    op.stop()
    try:
        cluster.apply(old, ns)
        start = time.monotonic()
        cluster.kubectl("delete", "mj", "-n", ns, "orphan", "--timeout=30s")
        assert time.monotonic() - start < 30
        assert not _exists(cluster, ns, "mj", "orphan")
    finally:
        op.start()
    # The operator removes the old finalizer, so that job's deletion does not need it either.
    cluster.wait(
        lambda: (
            not cluster.kubectl_json("get", "mj", "-n", ns, "legacy")["metadata"].get("finalizers")
        ),
        30,
        what="the old finalizer removed",
    )
    # The deleted job's pods go with the garbage collector (ownerReferences), not the operator.
    cluster.wait(lambda: pods(cluster, ns, "orphan") == [], 60, what="orphan's pods collected")


def test_deleting_a_namespace_completes_while_the_operator_is_down(
    cluster: Cluster, op: Op
) -> None:
    ns = f"gone-{int(time.time())}"
    cluster.kubectl("create", "namespace", ns)
    cluster.apply(tiny_gpu_job("doomed", nodes=1), ns)
    wait_phase(cluster, ns, "doomed", "Running")
    op.stop()
    try:
        cluster.kubectl("delete", "namespace", ns, "--timeout=90s", timeout=120)
    finally:
        op.start()
    assert cluster.kubectl("get", "namespace", ns, check=False).returncode != 0


def test_network_policy_with_the_operator_flag(cluster: Cluster, namespace: str, op: Op) -> None:
    ns = namespace
    op.stop()
    op.start("--network-policy")
    try:
        cluster.apply(tiny_gpu_job("fenced", nodes=2), ns)
        wait_phase(cluster, ns, "fenced", "Running")
        policy = cluster.kubectl_json("get", "networkpolicy", "-n", ns, "fenced")
        uid = cluster.kubectl_json("get", "mj", "-n", ns, "fenced")["metadata"]["uid"]
        assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
        selector = {"matchLabels": {"megatron.dev/job-name": "fenced"}}
        assert policy["spec"]["podSelector"] == selector
        assert policy["spec"]["ingress"] == [{"from": [{"podSelector": selector}]}]
    finally:
        op.stop()
        op.start()
    cluster.apply(tiny_gpu_job("open", nodes=1), ns)
    wait_phase(cluster, ns, "open", "Running")
    assert not _exists(cluster, ns, "networkpolicy", "open")  # off by default


def test_pod_deletes_carry_the_pods_uid(cluster: Cluster, namespace: str) -> None:
    """A late delete of a pod must not hit a newer pod of the same name."""
    ns = namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "same-name", "namespace": ns},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    kube = Kube(cluster.api_client(), workers=2)
    core = CoreV1Api(kube.client)
    try:
        first = core.create_namespaced_pod(ns, pod).metadata.uid
        core.delete_namespaced_pod("same-name", ns, grace_period_seconds=0)
        cluster.wait(lambda: not _exists(cluster, ns, "pod", "same-name"), 30, what="first gone")
        second = core.create_namespaced_pod(ns, pod).metadata.uid
        kube.delete_pods(ns, ["same-name"], {"same-name": first})  # stale: a no-op, no error
        time.sleep(1)
        now = cluster.kubectl_json("get", "pod", "-n", ns, "same-name")["metadata"]
        assert now["uid"] == second and not now.get("deletionTimestamp")
        kube.delete_pods(ns, ["same-name"], {"same-name": second})  # the right uid: it goes
        cluster.wait(lambda: not _exists(cluster, ns, "pod", "same-name"), 30, what="second gone")
    finally:
        kube.pool.shutdown()


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
# An RDMA fabric (resources.network.fabric) or an rdma/* request adds IPC_LOCK, which no level
# but privileged allows.
RDMA_EXAMPLES = {"llama3-70b", "deepseek-v2-lite", "megatron-lm-pretrain-gpt"}


def test_rdma_is_only_the_excluded_examples() -> None:
    """The examples left out below are left out for their fabric or rdma/* request (IPC_LOCK)."""
    for path in (REPO / "examples").glob("*.yaml"):
        rdma = "rdma/" in path.read_text() or "fabric: infiniband" in path.read_text()
        assert rdma == (path.stem in RDMA_EXAMPLES), path.name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_pods_pass_pod_security_restricted(
    cluster: Cluster, namespace: str, path: Path
) -> None:
    """Every example's pods are admitted at `restricted`; the RDMA ones are refused, which also
    shows the apiserver enforces the level here."""
    ns = namespace
    cluster.kubectl(
        "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    job = load_file(path)
    meta = job.metadata.model_copy(update={"namespace": ns, "uid": "0000-uid"})
    job = job.model_copy(update={"metadata": meta})
    p = plan(job.spec)
    # The ServiceAccount must exist for pod admission; ownerless, so no collector removes it.
    (account,) = [o for o in children(job, p) if o["kind"] == "ServiceAccount"]
    account["metadata"].pop("ownerReferences")
    cluster.apply(account, ns)
    rendered = render_pods(job, p, 0)[:2]
    for pod in rendered:
        pod["metadata"].pop("ownerReferences")
    proc = cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        ns,
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rendered}),
        check=False,
    )
    if path.stem in RDMA_EXAMPLES:
        assert proc.returncode != 0 and "IPC_LOCK" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
    assert "violate" not in proc.stderr, proc.stderr  # warn mode would still create
