"""Acceptance tests of the local control plane (issue 3), against the real apiserver, scheduler,
controller-manager, kwok and Kueue started by tests/cluster/cluster."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conftest import Cluster

DRIVER = Path(__file__).resolve().parents[1] / "cluster" / "cluster"

VERSIONS = dict(
    line.split("=", 1)
    for line in (DRIVER.parent / "versions.env").read_text().splitlines()
    if line and not line.startswith("#")
)


def run_driver(*args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(DRIVER), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"cluster {' '.join(args)}: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def pod_manifest(
    name: str,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    node_selector: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    owner: dict[str, Any] | None = None,
    extra_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sleep", "inf"],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if volumes:
        container["volumeMounts"] = [{"name": v["name"], "mountPath": "/data"} for v in volumes]
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 5}
    if affinity:
        spec["affinity"] = affinity
    if node_selector:
        spec["nodeSelector"] = node_selector
    if volumes:
        spec["volumes"] = volumes
    spec |= extra_spec or {}
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", selector
    )["items"]
    return items


def scheduled_condition(pod: dict[str, Any]) -> dict[str, Any]:
    for c in pod.get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled":
            return dict(c)
    return {}


def wait_unschedulable(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = scheduled_condition(cluster.pod(namespace, name))
        return cond if cond.get("reason") == "Unschedulable" else None

    result: dict[str, Any] = cluster.wait(check, 30, what=f"{name} Unschedulable")
    return result


@pytest.fixture
def cleanup_pods(cluster: Cluster, namespace: str) -> Iterator[None]:
    """Delete the test's pods and wait, so GPU capacity is free for the next test (the
    namespace itself is deleted asynchronously)."""
    yield
    cluster.kubectl(
        "delete",
        "pods",
        "--all",
        "-n",
        namespace,
        "--wait=true",
        "--timeout=60s",
        check=False,
        timeout=90,
    )


# ---------------------------------------------------------------------------------------------
# build and CLI


def test_build_is_cached_and_prints_paths() -> None:
    started = time.monotonic()
    out = run_driver("build")
    elapsed = time.monotonic() - started
    paths = dict(line.split("=", 1) for line in out.splitlines())
    assert elapsed < 10, f"a cached build took {elapsed:.1f} s"
    key = Path(paths["cache_dir"]).name
    for pin in ("K8S_VERSION", "KWOK_VERSION", "KUEUE_VERSION", "HELM_VERSION"):
        assert VERSIONS[pin] in key
    for tool in (
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "etcd",
        "kubectl",
        "kwok",
        "kueue",
        "helm",
    ):
        assert os.access(paths[tool], os.X_OK), tool
    assert sorted(p.name for p in Path(paths["kueue_crds"]).glob("*.yaml"))
    assert list(Path(paths["kwok_stages"]).rglob("pod-ready.yaml"))
    assert run_driver("paths") == out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["fail-pod", "no-slash", "--exit-code", "1", "--state", "/nonexistent"],
            "expected NAMESPACE/NAME",
        ),
        (
            ["fail-pod", "a/b", "--exit-code", "1", "--state", "/nonexistent"],
            "no cluster is running",
        ),
        (["down", "--state", "/nonexistent"], None),
        (["up", "--state", "/tmp/x", "--nodes", "0"], "must be >= 1"),
        (["up", "--state", "/tmp/x", "--nodes-per-rack", "9"], "invalid choice"),
        (["fail-pod", "a/b", "--exit-code", "one", "--state", "/tmp/x"], "not an integer"),
    ],
)
def test_cli_rejects_bad_input_clearly(args: list[str], message: str | None) -> None:
    proc = subprocess.run([str(DRIVER), *args], capture_output=True, text=True, check=False)
    assert "Traceback" not in proc.stderr
    if message is None:  # down of a directory with no cluster is a no-op
        assert proc.returncode == 0
        assert "nothing was running" in proc.stdout
    else:
        assert proc.returncode != 0
        assert message in proc.stderr


def test_up_refuses_a_running_state_dir(cluster: Cluster) -> None:
    proc = subprocess.run(
        [str(DRIVER), "up", "--state", str(cluster.state_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "already running" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------
# nodes, scheduling


def test_fake_gpu_nodes_have_capacity_and_topology_labels(cluster: Cluster) -> None:
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == sorted(cluster.nodes)
    for n in nodes:
        labels = n["metadata"]["labels"]
        assert n["status"]["allocatable"][cluster.gpu_resource] == str(cluster.gpus_per_node)
        assert n["status"]["capacity"]["cpu"] and n["status"]["capacity"]["memory"]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        for key in (cluster.zone_key, cluster.rack_key, cluster.nvlink_key):
            assert labels[key], key
        ready = {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"]
        assert ready == "True"
        assert not [t for t in n["spec"].get("taints") or [] if "not-ready" in t["key"]]
    racks = cluster.racks
    assert len(racks) >= 2
    assert all(2 <= len(members) <= 4 for members in racks.values()), racks


def test_gpu_pod_is_scheduled_and_running(
    cluster: Cluster, namespace: str, cleanup_pods: None
) -> None:
    cluster.apply(pod_manifest("gpu8", gpus=8), namespace)
    pod = cluster.wait_pod_phase(namespace, "gpu8", "Running")
    assert pod["spec"]["nodeName"] in cluster.nodes
    assert scheduled_condition(pod)["status"] == "True"
    assert pod["status"]["podIP"], "kwok gives Running pods an IP"
    assert all(c["ready"] for c in pod["status"]["containerStatuses"])
    events = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=gpu8"
    )["items"]
    assert "Scheduled" in {e["reason"] for e in events}


def test_nine_gpu_pod_stays_pending_insufficient_gpu(
    cluster: Cluster, namespace: str, cleanup_pods: None
) -> None:
    cluster.apply(pod_manifest("gpu9", gpus=cluster.gpus_per_node + 1), namespace)
    cond = wait_unschedulable(cluster, namespace, "gpu9")
    assert "Insufficient nvidia.com/gpu" in cond["message"]
    time.sleep(2)
    pod = cluster.pod(namespace, "gpu9")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_hostname_anti_affinity_spreads_pods(
    cluster: Cluster, namespace: str, cleanup_pods: None
) -> None:
    two_nodes = cluster.nodes[:2]
    affinity = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "spread"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": two_nodes}
                        ]
                    }
                ]
            }
        },
    }
    for i in range(3):
        cluster.apply(
            pod_manifest(f"spread-{i}", gpus=1, labels={"app": "spread"}, affinity=affinity),
            namespace,
        )

    def two_running() -> list[dict[str, Any]] | None:
        running = [
            p
            for p in pods(cluster, namespace, "app=spread")
            if p["status"].get("phase") == "Running"
        ]
        return running if len(running) == 2 else None

    running = cluster.wait(two_running, 30, what="two spread pods Running")
    assert sorted(p["spec"]["nodeName"] for p in running) == sorted(two_nodes)
    # Two nodes, three pods: the third cannot go anywhere, though each node has 7 free GPUs.
    pending = [
        p for p in pods(cluster, namespace, "app=spread") if p["status"].get("phase") == "Pending"
    ]
    assert len(pending) == 1
    cond = wait_unschedulable(cluster, namespace, pending[0]["metadata"]["name"])
    assert "anti-affinity" in cond["message"]


def test_rack_pod_affinity_keeps_group_in_one_rack(
    cluster: Cluster, namespace: str, cleanup_pods: None
) -> None:
    racks = cluster.racks
    rack_size = len(next(iter(racks.values())))
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"group": "g1"}}, "topologyKey": cluster.rack_key}
            ]
        }
    }
    # One more whole-node pod than the rack has nodes: the extra one must stay Pending even
    # though every other rack has free nodes.
    n = rack_size + 1
    for i in range(n):
        cluster.apply(
            pod_manifest(
                f"g1-{i}", gpus=cluster.gpus_per_node, labels={"group": "g1"}, affinity=affinity
            ),
            namespace,
        )

    def settled() -> list[dict[str, Any]] | None:
        items = pods(cluster, namespace, "group=g1")
        phases = [p["status"].get("phase") for p in items]
        unsched = [p for p in items if scheduled_condition(p).get("reason") == "Unschedulable"]
        return items if phases.count("Running") == rack_size and len(unsched) == 1 else None

    items = cluster.wait(settled, 60, what=f"{rack_size} pods Running and 1 Unschedulable")
    node_rack = {
        n["metadata"]["name"]: n["metadata"]["labels"][cluster.rack_key]
        for n in cluster.kubectl_json("get", "nodes")["items"]
    }
    used = {node_rack[p["spec"]["nodeName"]] for p in items if p["spec"].get("nodeName")}
    assert len(used) == 1, f"group spread over racks {used}"
    assert len({p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName")}) == rack_size


# ---------------------------------------------------------------------------------------------
# storage


def test_rwx_pvc_binds_to_hostpath_pv_and_pod_schedules(
    cluster: Cluster, namespace: str, cleanup_pods: None
) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cluster.shared_storage_class,
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }
    cluster.apply(pvc, namespace)

    def bound_claim() -> dict[str, Any] | None:
        claim: dict[str, Any] = cluster.kubectl_json("get", "pvc", "-n", namespace, "ckpt")
        return claim if claim.get("status", {}).get("phase") == "Bound" else None

    bound = cluster.wait(bound_claim, 30, what="PVC Bound")
    pv_name = bound["spec"]["volumeName"]
    try:
        assert pv_name in cluster.pvs
        pv = cluster.kubectl_json("get", "pv", pv_name)
        assert pv["spec"]["hostPath"]["path"]
        assert "ReadWriteMany" in pv["spec"]["accessModes"]
        cluster.apply(
            pod_manifest(
                "uses-pvc",
                volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            ),
            namespace,
        )
        pod = cluster.wait_pod_phase(namespace, "uses-pvc", "Running")
        assert pod["spec"]["nodeName"] in cluster.nodes
    finally:
        # Hand the static PV back (Retain policy): delete the claim, then clear the claimRef.
        cluster.kubectl(
            "delete",
            "pod",
            "uses-pvc",
            "-n",
            namespace,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
            timeout=90,
        )
        cluster.kubectl(
            "delete", "pvc", "ckpt", "-n", namespace, "--wait=true", "--timeout=60s", timeout=90
        )
        cluster.kubectl(
            "patch",
            "pv",
            pv_name,
            "--type=json",
            "-p",
            '[{"op": "remove", "path": "/spec/claimRef"}]',
        )
        cluster.wait(
            lambda: cluster.kubectl_json("get", "pv", pv_name)["status"]["phase"] == "Available",
            30,
            what=f"PV {pv_name} Available again",
        )


def test_default_storage_class_provisions_rwx_volumes(cluster: Cluster, namespace: str) -> None:
    for i in range(3):
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"dyn-{i}"},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
            namespace,
        )

    def all_bound() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = cluster.kubectl_json("get", "pvc", "-n", namespace)["items"]
        return items if all(c["status"].get("phase") == "Bound" for c in items) else None

    claims = cluster.wait(all_bound, 60, what="dynamic PVCs Bound")
    volumes = set()
    for claim in claims:
        assert claim["spec"]["storageClassName"] == cluster.default_storage_class
        volumes.add(claim["spec"]["volumeName"])
    assert len(volumes) == 3
    cluster.kubectl(
        "delete", "pvc", "--all", "-n", namespace, "--wait=true", "--timeout=60s", timeout=90
    )
    cluster.wait(
        lambda: (
            not volumes
            & {pv["metadata"]["name"] for pv in cluster.kubectl_json("get", "pv")["items"]}
        ),
        60,
        what="provisioned PVs deleted with their claims (reclaimPolicy Delete)",
    )


# ---------------------------------------------------------------------------------------------
# garbage collection, kwok lifecycle


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_deleting_an_owner_deletes_its_dependents(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}, namespace
    )
    owner = cluster.kubectl_json("get", "configmap", "-n", namespace, "owner")
    for i in range(3):
        cluster.apply(
            pod_manifest(f"dep-{i}", labels={"dep": "yes"}, owner=owner_ref(owner)), namespace
        )
    cluster.wait(
        lambda: all(
            p["status"].get("phase") == "Running" for p in pods(cluster, namespace, "dep=yes")
        ),
        30,
        what="dependents Running",
    )
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    cluster.wait(
        lambda: not pods(cluster, namespace, "dep=yes"),
        60,
        what="the garbage collector to delete the dependents",
    )


def test_gc_of_dependents_of_a_custom_resource(cluster: Cluster, namespace: str) -> None:
    """Like the operator's pods, owned by a MegatronJob: the GC must handle CR owners (it
    discovers new CRD kinds on its 30 s resync, so this can take that long)."""
    group = "gctest.megatron.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"owners.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "owners", "singular": "owner", "kind": "Owner"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    cluster.apply(crd)
    cluster.wait_crd_established(f"owners.{group}", timeout=30)
    cluster.apply(
        {"apiVersion": f"{group}/v1", "kind": "Owner", "metadata": {"name": "job"}}, namespace
    )
    owner = cluster.kubectl_json("get", f"owners.{group}", "-n", namespace, "job")
    for i in range(2):
        cluster.apply(
            pod_manifest(f"cr-dep-{i}", labels={"crdep": "yes"}, owner=owner_ref(owner)), namespace
        )
    assert len(pods(cluster, namespace, "crdep=yes")) == 2
    cluster.kubectl("delete", f"owners.{group}", "job", "-n", namespace)
    cluster.wait(
        lambda: not pods(cluster, namespace, "crdep=yes"),
        90,
        interval=1,
        what="GC of pods owned by a custom resource",
    )


def test_fail_pod_turns_running_into_failed_with_exit_code(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(pod_manifest("victim"), namespace)
    cluster.wait_pod_phase(namespace, "victim", "Running")
    out = run_driver(
        "fail-pod", f"{namespace}/victim", "--exit-code", "42", "--state", str(cluster.state_dir)
    )
    assert out.strip() == f"pod {namespace}/victim Failed"
    pod = cluster.pod(namespace, "victim")
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 42
    assert terminated["reason"] == "Error"
    # A pod that is no longer Running cannot be failed again: a clear error.
    proc = subprocess.run(
        [
            str(DRIVER),
            "fail-pod",
            f"{namespace}/victim",
            "--exit-code",
            "1",
            "--state",
            str(cluster.state_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert "is Failed, not Running" in proc.stderr


def test_complete_pod_succeeds_with_exit_code_zero(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod_manifest("finisher"), namespace)
    cluster.wait_pod_phase(namespace, "finisher", "Running")
    time.sleep(3)  # kwok never completes a pod on its own
    assert cluster.pod_phase(namespace, "finisher") == "Running"
    cluster.complete_pod(namespace, "finisher")
    pod = cluster.pod(namespace, "finisher")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_pods_of_a_job_stay_running_until_told(cluster: Cluster, namespace: str) -> None:
    """kwok's stock pod-complete stage would finish Job pods at once; ours does not."""
    cluster.apply(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox:1.36"}],
                    }
                },
            },
        },
        namespace,
    )
    pod = cluster.wait(
        lambda: [
            p
            for p in pods(cluster, namespace, "job-name=j")
            if p["status"].get("phase") == "Running"
        ],
        30,
        what="the Job's pod Running",
    )[0]
    time.sleep(3)
    assert cluster.pod_phase(namespace, pod["metadata"]["name"]) == "Running"
    cluster.complete_pod(namespace, pod["metadata"]["name"])
    cluster.wait(
        lambda: (
            cluster.kubectl_json("get", "job", "-n", namespace, "j")["status"].get("succeeded") == 1
        ),
        30,
        what="the Job controller to count the success",
    )


def test_eviction_adds_disruption_target_and_pod_goes_away(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(pod_manifest("evictee"), namespace)
    cluster.wait_pod_phase(namespace, "evictee", "Running")
    cluster.evict_pod(namespace, "evictee")
    conds = {c["type"]: c for c in cluster.pod(namespace, "evictee")["status"]["conditions"]}
    assert conds["DisruptionTarget"]["status"] == "True"
    assert conds["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    cluster.wait(
        lambda: (
            cluster.kubectl(
                "get", "pod", "-n", namespace, "evictee", "-o", "json", check=False
            ).returncode
            != 0
        ),
        15,
        what="the evicted pod to be gone (kwok pod-delete stage)",
    )


def test_graceful_delete_completes(cluster: Cluster, namespace: str) -> None:
    cluster.apply(pod_manifest("deleted"), namespace)
    cluster.wait_pod_phase(namespace, "deleted", "Running")
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "deleted", "-n", namespace, "--wait=true", "--timeout=30s")
    assert time.monotonic() - started < 10


def test_headless_service_lists_pod_ips(cluster: Cluster, namespace: str) -> None:
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "hl"},
            "spec": {
                "clusterIP": "None",
                "selector": {"svc": "hl"},
                "ports": [{"name": "rdzv", "port": 29500}],
            },
        },
        namespace,
    )
    for i in range(2):
        cluster.apply(
            pod_manifest(
                f"hl-{i}",
                labels={"svc": "hl"},
                extra_spec={"hostname": f"hl-{i}", "subdomain": "hl"},
            ),
            namespace,
        )

    def with_ips() -> list[dict[str, Any]] | None:
        items = pods(cluster, namespace, "svc=hl")
        return items if len(items) == 2 and all(p["status"].get("podIP") for p in items) else None

    ips = {p["status"]["podIP"] for p in cluster.wait(with_ips, 30, what="pod IPs")}
    assert len(ips) == 2

    def endpoint_ips() -> set[str] | None:
        slices = cluster.kubectl_json(
            "get", "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=hl"
        )["items"]
        got = {
            a
            for s in slices
            for e in s.get("endpoints") or []
            for a in e["addresses"]
            if (e.get("conditions") or {}).get("ready")
        }
        return got if got == ips else None

    cluster.wait(endpoint_ips, 30, what="EndpointSlice with both pod IPs")


# ---------------------------------------------------------------------------------------------
# kubectl, helm


def test_kubectl_reports_the_real_version(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == VERSIONS["K8S_VERSION"]
    assert out["serverVersion"]["gitVersion"] == VERSIONS["K8S_VERSION"]
    auth = cluster.kubectl("auth", "can-i", "create", "pods", "--all-namespaces")
    assert auth.stdout.strip() == "yes"
    anon = cluster.kubectl(
        "auth", "can-i", "create", "pods", "--as=system:serviceaccount:default:default", check=False
    )
    assert anon.stdout.strip() == "no", "RBAC is enforced"


CHART_YAML = "apiVersion: v2\nname: trivial\nversion: 0.1.0\n"
CHART_TEMPLATE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-info
data:
  kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}
  greeting: {{ .Values.greeting | quote }}
"""


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    d = tmp_path / "trivial"
    (d / "templates").mkdir(parents=True)
    (d / "Chart.yaml").write_text(CHART_YAML)
    (d / "values.yaml").write_text("greeting: hello\n")
    (d / "templates" / "configmap.yaml").write_text(CHART_TEMPLATE)
    return d


def helm_env(cluster: Cluster, tmp: Path) -> dict[str, str]:
    env = cluster.env
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp / var.lower())
    return env


def test_helm_version_template_and_install(
    cluster: Cluster, namespace: str, chart: Path, tmp_path: Path
) -> None:
    env = helm_env(cluster, tmp_path)

    def helm(*args: str) -> str:
        proc = subprocess.run(
            [str(cluster.helm_path), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert helm("version", "--short").startswith(VERSIONS["HELM_VERSION"])
    k8s_minor = ".".join(VERSIONS["K8S_VERSION"].split(".")[:2])
    offline = helm("template", "demo", str(chart))
    assert f'kubeVersion: "{k8s_minor}.0"' in offline, offline  # the ldflags, not v1.20
    against_cluster = helm("template", "demo", str(chart), "--validate")
    assert f'kubeVersion: "{VERSIONS["K8S_VERSION"]}"' in against_cluster
    helm("install", "demo", str(chart), "-n", namespace, "--set", "greeting=hi", "--wait")
    cm = cluster.kubectl_json("get", "configmap", "-n", namespace, "demo-info")
    assert cm["data"] == {"kubeVersion": VERSIONS["K8S_VERSION"], "greeting": "hi"}
    releases = json.loads(helm("list", "-n", namespace, "-o", "json"))
    assert [(r["name"], r["status"]) for r in releases] == [("demo", "deployed")]
    helm("uninstall", "demo", "-n", namespace, "--wait")
    assert (
        cluster.kubectl("get", "configmap", "-n", namespace, "demo-info", check=False).returncode
        != 0
    )


# ---------------------------------------------------------------------------------------------
# Kueue


def test_kueue_admits_a_v1beta2_workload(cluster: Cluster, namespace: str) -> None:
    if not cluster.kueue:
        pytest.fail("the shared cluster was started without Kueue (MEGATRON_CLUSTER_KUEUE=0)")
    suffix = uuid.uuid4().hex[:6]
    flavor, cq = f"gpu-{suffix}", f"cq-{suffix}"
    cluster.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        }
    )
    cluster.apply(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "512Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
    )
    try:
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "lq"},
                "spec": {"clusterQueue": cq},
            },
            namespace,
        )

        def active() -> bool:
            status = cluster.kubectl_json("get", "clusterqueue", cq).get("status") or {}
            conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
            return conds.get("Active") == "True"

        cluster.wait(active, 30, what="ClusterQueue Active")
        template = {
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox:1.36",
                        "resources": {
                            "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "8"},
                            "limits": {"nvidia.com/gpu": "8"},
                        },
                    }
                ],
            }
        }
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": "wl"},
                "spec": {
                    "queueName": "lq",
                    "podSets": [{"name": "workers", "count": 2, "template": template}],
                },
            },
            namespace,
        )

        def admitted() -> dict[str, Any] | None:
            wl = cluster.kubectl_json("get", "workloads.kueue.x-k8s.io", "-n", namespace, "wl")
            conds = {c["type"]: c["status"] for c in wl.get("status", {}).get("conditions") or []}
            return (
                wl
                if conds.get("QuotaReserved") == "True" and conds.get("Admitted") == "True"
                else None
            )

        wl = cluster.wait(admitted, 60, what="Workload QuotaReserved and Admitted")
        admission = wl["status"]["admission"]
        assert admission["clusterQueue"] == cq
        assignment = admission["podSetAssignments"][0]
        assert assignment["name"] == "workers"
        assert assignment["count"] == 2
        assert assignment["flavors"]["nvidia.com/gpu"] == flavor
        assert assignment["resourceUsage"]["nvidia.com/gpu"] == "16"
        # A second one does not fit the 16-GPU quota: it is not admitted.
        cluster.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Workload",
                "metadata": {"name": "wl2"},
                "spec": {
                    "queueName": "lq",
                    "podSets": [{"name": "workers", "count": 1, "template": template}],
                },
            },
            namespace,
        )

        def pending_reason() -> str | None:
            wl2 = cluster.kubectl_json("get", "workloads.kueue.x-k8s.io", "-n", namespace, "wl2")
            conds = {c["type"]: c for c in wl2.get("status", {}).get("conditions") or []}
            qr = conds.get("QuotaReserved")
            return str(qr["message"]) if qr and qr["status"] == "False" else None

        assert "insufficient" in cluster.wait(pending_reason, 30, what="wl2 pending").lower()
    finally:
        cluster.kubectl(
            "delete",
            "workloads.kueue.x-k8s.io",
            "--all",
            "-n",
            namespace,
            "--wait=true",
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        cluster.kubectl(
            "delete", "localqueue", "lq", "-n", namespace, "--ignore-not-found", check=False
        )
        cluster.kubectl(
            "delete", "clusterqueue", cq, "--ignore-not-found", "--wait=false", check=False
        )
        cluster.kubectl(
            "delete", "resourceflavor", flavor, "--ignore-not-found", "--wait=false", check=False
        )


# ---------------------------------------------------------------------------------------------
# a second, private cluster: node faults and teardown


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            out.append((int(d.name), cmdline))
    return out


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def listening_addresses(pids: Iterator[int] | list[int]) -> list[tuple[int, str]]:
    """(pid, "ip:port") of every listening TCP socket of these processes, from /proc."""
    inode_pid: dict[str, int] = {}
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode_pid[target[8:-1]] = pid
    out = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inode_pid:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            if v6:
                words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
                ip = socket.inet_ntop(socket.AF_INET6, b"".join(words))
            else:
                ip = socket.inet_ntoa(raw[::-1])
            out.append((inode_pid[inode], f"{ip}:{int(port_hex, 16)}"))
    return out


def ready(obj: dict[str, Any]) -> str:
    return str({c["type"]: c["status"] for c in obj["status"]["conditions"]}["Ready"])


def test_second_cluster_node_faults_and_clean_teardown(
    cluster_factory: Callable[..., Cluster],
) -> None:
    started = time.monotonic()
    c = cluster_factory(
        nodes=2,
        nodes_per_rack=2,
        kueue=False,
        extra_args=["--pvs", "0", "--not-ready-toleration-seconds", "5"],
    )
    up_seconds = time.monotonic() - started
    state = c.state_dir
    pids = {p.stem: int(p.read_text().split()[0]) for p in (state / "pids").glob("*.pid")}
    assert set(pids) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    try:
        listening = listening_addresses(list(pids.values()))
        assert {p for p, _ in listening} >= {pids["etcd"], pids["kube-apiserver"]}
        for pid, address in listening:
            assert address.startswith(("127.0.0.1:", "::1:")), f"pid {pid} listens on {address}"

        node = c.nodes[0]
        c.kubectl("create", "namespace", "t")
        c.wait(
            lambda: (
                c.kubectl("get", "sa", "default", "-n", "t", "-o", "json", check=False).returncode
                == 0
            ),
            30,
            what="default SA",
        )
        c.apply(pod_manifest("on-node", node_selector={"kubernetes.io/hostname": node}), "t")
        c.wait_pod_phase("t", "on-node", "Running")
        # Every version of the pod, from a watch: under CI load the eviction's condition and the
        # pod's removal came closer together than a polling kubectl could see.
        watch = subprocess.Popen(
            [str(c.kubectl_path), f"--kubeconfig={c.kubeconfig}", "get", "pod", "-n", "t",
             "on-node", "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        c.fail_node(node)
        assert ready(c.kubectl_json("get", "node", node)) == "False"
        time.sleep(3)  # kwok's node-initialize stage must not undo the failure
        assert ready(c.kubectl_json("get", "node", node)) == "False"
        # The node-lifecycle controller taints the node; after the default not-ready toleration
        # (5 s in this cluster) the taint-eviction controller evicts the pod with a
        # DisruptionTarget condition.
        c.wait(
            lambda: any(
                t["key"] == "node.kubernetes.io/not-ready" and t["effect"] == "NoExecute"
                for t in c.kubectl_json("get", "node", node)["spec"].get("taints") or []
            ),
            30,
            what="the not-ready NoExecute taint",
        )
        try:
            c.wait(
                lambda: (
                    c.kubectl(
                        "get", "pod", "-n", "t", "on-node", "-o", "json", check=False
                    ).returncode
                    != 0
                ),
                60,
                interval=0.5,
                what="the pod on the failed node to be evicted",
            )
        finally:
            watch.terminate()
            out, _ = watch.communicate(timeout=30)
        seen: list[dict[str, Any]] = []
        decoder, at = json.JSONDecoder(), 0
        while out[at:].strip():
            at += len(out[at:]) - len(out[at:].lstrip())
            event, at = decoder.raw_decode(out, at)
            conditions = event["object"].get("status", {}).get("conditions") or []
            seen.extend(x for x in conditions if x["type"] == "DisruptionTarget")
        assert seen, "no DisruptionTarget condition was seen before the pod went away"
        assert seen[-1]["reason"] == "DeletionByTaintManager"
        c.recover_node(node)
        assert ready(c.kubectl_json("get", "node", node)) == "True"
        c.wait(
            lambda: (
                not [
                    t
                    for t in c.kubectl_json("get", "node", node)["spec"].get("taints") or []
                    if "not-ready" in t["key"]
                ]
            ),
            30,
            what="taints removed",
        )
    finally:
        down = run_driver("down", "--state", str(state))
    c.down()  # the fixture's bookkeeping: already down, nothing more to do
    assert "kube-apiserver" in down and "etcd" in down
    for name, pid in pids.items():
        path = Path(f"/proc/{pid}/stat")
        alive = path.exists() and path.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        assert not alive, f"{name} (pid {pid}) still running after down"
    assert processes_mentioning(str(state)) == []
    for port in c.info["ports"].values():
        assert not port_open(port), f"port {port} still open"
    assert not list((state / "pids").glob("*.pid"))
    assert run_driver("down", "--state", str(state)).strip() == "stopped: nothing was running"
    assert up_seconds < 60, f"cluster up took {up_seconds:.1f} s"


def test_shared_cluster_processes_are_recorded(cluster: Cluster) -> None:
    """The shared cluster's processes are the ones in its state dir, all alive, and nothing
    else of ours mentions the state dir."""
    pids = {
        p.stem: int(p.read_text().split()[0]) for p in (cluster.state_dir / "pids").glob("*.pid")
    }
    expected = {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
    if cluster.kueue:
        expected.add("kueue")
    assert set(pids) == expected
    mentioning = {pid for pid, _ in processes_mentioning(str(cluster.state_dir))}
    assert mentioning <= set(pids.values()) | {os.getpid()}, mentioning
    assert set(pids.values()) <= mentioning
    assert re.fullmatch(r"https://127\.0\.0\.1:\d+", cluster.server)
