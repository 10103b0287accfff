"""The opened pod on a real apiserver, scheduler and kwok nodes: spec.template, the data claim and
the evidence, with `mjob operator` running.

- the apiserver refuses every operator-owned field set through the template, with a message
  naming it (the same table `mjob validate` is tested with: tests/unit/template_cases.py);
- one job uses all of it (a data claim, an annotation, an imagePullSecrets entry, an env var from
  a Secret, a native and an ordinary sidecar) and its pods carry each one;
- a pod the apiserver finds invalid becomes the CreateFailure condition with its message;
- a 0.9 MB template is refused by the apiserver, and one within the CRD's caps but over the
  template's budget by the operator, before it plans;
- `mjob status` tells the story of a job on the current kubeconfig;
- the chart's admission policy enforces its template allow-lists.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.unit.template_cases import FULL_TEMPLATE, REFUSED, Refused, heavy_template

from .conftest import REPO, Cluster
from .operator_support import (
    Op,
    condition,
    install_crd,
    operator,  # noqa: F401 - fixture
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)

CHART = str(REPO / "charts" / "megatron-operator")
OVER_BUDGET = heavy_template(16 * (256 * 3 + 6), 200_000)


@pytest.fixture(scope="module")
def custom(cluster: Cluster) -> Any:
    import kubernetes

    install_crd(cluster)
    return kubernetes.client.CustomObjectsApi(cluster.api_client())


def _dry_run(custom: Any, namespace: str, doc: dict[str, Any]) -> str | None:
    """None when the apiserver accepts the job, else its message."""
    try:
        custom.create_namespaced_custom_object(
            "megatron.dev", "v1alpha1", namespace, "megatronjobs", doc, dry_run="All"
        )
    except ApiException as exc:
        return str(json.loads(exc.body).get("message", exc.body))
    return None


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_the_apiserver_refuses_each_owned_field_by_name(
    custom: Any, namespace: str, case: Refused
) -> None:
    doc = tiny_gpu_job("probe", nodes=1, template=case.template)
    message = _dry_run(custom, namespace, doc)
    assert message is not None, "the apiserver accepted an operator-owned field"
    assert case.field in message and case.why in message, message


def test_the_full_template_is_accepted(custom: Any, namespace: str) -> None:
    assert (
        _dry_run(custom, namespace, tiny_gpu_job("full", nodes=1, template=FULL_TEMPLATE)) is None
    )


def _objects(cluster: Cluster, ns: str) -> None:
    """What the template names: a Secret, a ConfigMap, registry credentials, data claims, and
    the RuntimeClass (the apiserver refuses a pod naming one that does not exist)."""
    cluster.apply(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"},
         "handler": "nvidia"}
    )  # fmt: skip
    config = {"auths": {"registry.example": {"auth": "dXNlcjpwYXNz"}}}
    for doc in (
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wandb"},
         "stringData": {"api-key": "s3cr3t"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team-settings"},
         "data": {"TEAM": "pretraining"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry-creds"},
         "type": "kubernetes.io/dockerconfigjson",
         "stringData": {".dockerconfigjson": json.dumps(config)}},
        *[
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
             "spec": {"accessModes": ["ReadWriteMany"],
                      "resources": {"requests": {"storage": "1Gi"}}}}
            for name in ("corpus", "lustre")
        ],
    ):  # fmt: skip
        cluster.apply(doc, ns)


def test_one_job_uses_all_of_it(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    _objects(cluster, ns)
    # The kwok nodes carry no pool or health labels and no hugepages: the template's placement
    # and hugepages would leave the pods Pending here (tests/unit/test_template.py checks that
    # they reach the pod).
    template = copy.deepcopy(FULL_TEMPLATE)
    del template["spec"]["nodeSelector"], template["spec"]["affinity"]
    trainer = next(c for c in template["spec"]["containers"] if c["name"] == "trainer")
    del trainer["resources"]
    cluster.apply(
        tiny_gpu_job("open", nodes=2, template=template, data={"volume": {"claimName": "corpus"}}),
        ns,
    )
    try:
        running = wait_pods(cluster, ns, "open", 2, phase="Running", timeout=90)
    except AssertionError as exc:
        seen = [(p["metadata"]["name"], p.get("status")) for p in pods(cluster, ns, "open")]
        raise AssertionError(f"{exc}; status {status(cluster, ns, 'open')}; pods {seen}") from None
    wait_phase(cluster, ns, "open", "Running")
    for pod in running:
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-sriov"
        assert meta["labels"]["team"] == "pretraining"
        assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
        claims = {
            v["name"]: v["persistentVolumeClaim"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        assert claims["megatron-data"] == {"claimName": "corpus", "readOnly": True}
        assert claims["datasets"]["claimName"] == "lustre"
        trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
        env = {e["name"]: e for e in trainer["env"]}
        assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "wandb",
            "key": "api-key",
        }
        assert env["MEGATRON_DATA_DIR"]["value"] == "/mnt/data"
        assert {"name": "megatron-data", "mountPath": "/mnt/data", "readOnly": True} in trainer[
            "volumeMounts"
        ]
        assert [c["name"] for c in spec["containers"]] == ["trainer", "metrics-exporter"]
        [sidecar] = spec["initContainers"]
        assert sidecar["name"] == "log-shipper" and sidecar["restartPolicy"] == "Always"
        assert spec["runtimeClassName"] == "nvidia" and spec["restartPolicy"] == "Never"
    # The Secret's value is nowhere in the job or its ConfigMap: only the pods read it.
    job_text = json.dumps(cluster.kubectl_json("get", "mj", "-n", ns, "open"))
    config_text = json.dumps(cluster.kubectl_json("get", "configmap", "-n", ns, "open-config"))
    assert "s3cr3t" not in job_text and "s3cr3t" not in config_text


def test_an_oversized_template_reaches_neither_the_operator_nor_a_pod(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    # 0.9 MB of DNS options on 64 nodes (a 0.9 MB template once cost the operator 13 MB per
    # rendered pod): the apiserver refuses it, naming the field.
    options = [{"name": f"opt{i:05d}"} for i in range(45_000)]
    doc = tiny_gpu_job("huge", nodes=64, template={"spec": {"dnsConfig": {"options": options}}})
    text = json.dumps(doc)
    assert 0.85e6 < len(text) < 1.0e6
    proc = cluster.kubectl("create", "-n", namespace, "-f", "-", input=text, check=False)
    assert proc.returncode != 0
    assert "spec.template.spec.dnsConfig.options: Too many: 45000: must have at most 16" in (
        proc.stderr
    ), proc.stderr[:2000]
    # Within every cap of the CRD but over the template's budget (12,000 values): stored, and
    # refused by the operator before it plans anything, naming the field.
    heavy = json.dumps(tiny_gpu_job("heavy", nodes=64, template=OVER_BUDGET))
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=heavy)
    st = wait_phase(cluster, namespace, "heavy", "Failed", timeout=60)
    failed = condition(st, "Failed")
    assert failed is not None and failed["reason"] == "InvalidSpec", st
    assert failed["message"].startswith("spec.template: the template holds 12,"), failed
    assert "(spec.template.spec.containers: " in failed["message"]
    assert pods(cluster, namespace, "heavy") == [] and "layout" not in st


def test_a_pod_the_apiserver_refuses_is_a_create_failure(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    # Two sources in one volume: the CRD does not check that a volume has one source, the
    # pod's own validation refuses them when the operator creates the pod.
    bad = {"spec": {"volumes": [{"name": "two", "emptyDir": {}, "hostPath": {"path": "/tmp"}}]}}
    cluster.apply(tiny_gpu_job("refused", nodes=1, template=bad), namespace)
    st = wait_phase(cluster, namespace, "refused", "Failed", timeout=60)
    created = condition(st, "CreateFailure")
    assert created is not None and created["status"] == "True", st
    assert "may not specify more than 1 volume type" in created["message"], created
    assert pods(cluster, namespace, "refused") == []


def test_mjob_status_tells_the_story(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("story", nodes=2), ns)
    wait_pods(cluster, ns, "story", 2, phase="Running", attempt=0, timeout=90)
    wait_phase(cluster, ns, "story", "Running")
    cluster.fail_pod(ns, "story-a0-1", exit_code=3, wait=False)
    wait_pods(cluster, ns, "story", 2, phase="Running", attempt=1, timeout=90)
    wait_phase(cluster, ns, "story", "Running")
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", "status", "story", "-n", ns],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith(f"MegatronJob {ns}/story: Running, attempt 1 (1 restarts, 1 counted")
    assert "Error (story-a0-1 on " in out and "exit 3) → Restart" in out
    kept = next(line for line in out.splitlines() if line.strip().startswith("story-a0-1"))
    assert "Failed" in kept and "kept for its logs" in kept
    assert "AttemptFailed" in out and "attempt 0: 1 pod(s) failed: pod story-a0-1" in out
    missing = subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", "status", "nope", "-n", ns],
        capture_output=True,
        text=True,
        env=cluster.env,
        timeout=120,
        check=False,
    )
    assert (
        missing.returncode == 2 and f"no MegatronJob 'nope' in namespace '{ns}'" in missing.stderr
    )


def test_the_admission_policy_holds_the_template_allow_lists(
    cluster: Cluster, namespace: str, custom: Any
) -> None:
    release = "tpl"
    cluster.helm(
        "install", release, CHART, "-n", namespace, "--wait=false",
        "--set", "crds.install=false", "--set", "clusterWide=true",
        "--set", "admissionPolicy.enabled=true",
        "--set", "admissionPolicy.images.allowed={registry.example/*,docker.io/library/trainer}",
        "--set", "admissionPolicy.images.requirePullPolicyAlways=true",
        "--set", "admissionPolicy.scheduling.allowedNodeSelectorKeys={nvidia.com/gpu.product}",
        "--set", "admissionPolicy.template.allowedFields={volumes,containers,initContainers,imagePullSecrets,nodeSelector,tolerations}",
        "--set", "admissionPolicy.template.allowedSchedulerNames={default-scheduler}",
    )  # fmt: skip
    policy = f"{release}-megatron-operator-limits"
    try:

        def attempt(template: dict[str, Any]) -> str:
            doc = tiny_gpu_job("vap", nodes=1, imagePullPolicy="Always", template=template)
            proc = cluster.kubectl(
                "create", "--dry-run=server", "-n", namespace, "-f", "-",
                input=yaml.safe_dump(doc), check=False,
            )  # fmt: skip
            return "" if proc.returncode == 0 else proc.stderr

        host = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/var/run"}}]}}
        deadline = time.monotonic() + 30  # the apiserver loads a new policy within seconds
        while not attempt(host) and time.monotonic() < deadline:
            time.sleep(0.5)
        cases = {
            "hostPath": (host, "only these volume types are allowed"),
            "a field not allowed": (
                {"spec": {"runtimeClassName": "nvidia"}},
                "spec.template.spec.runtimeClassName is not allowed in this cluster",
            ),
            "a sidecar from elsewhere": (
                {"spec": {"containers": [{"name": "x", "image": "docker.io/evil:1"}]}},
                "spec.template.spec: an init or sidecar container's image, or an image volume's",
            ),
            # A prefix match would let this one through: the repository is read as a whole.
            "a look-alike registry": (
                {
                    "spec": {
                        "initContainers": [
                            {
                                "name": "x",
                                "image": "registry.example.evil.io/x:1",
                                "imagePullPolicy": "Always",
                            }
                        ]
                    }
                },
                "spec.template.spec: an init or sidecar container's image, or an image volume's",
            ),
            "a sidecar from a node's cache": (
                {
                    "spec": {
                        "containers": [
                            {
                                "name": "x",
                                "image": "registry.example/x:1",
                                "imagePullPolicy": "IfNotPresent",
                            }
                        ]
                    }
                },
                "needs imagePullPolicy Always",
            ),
            "every taint tolerated": (
                {"spec": {"tolerations": [{"operator": "Exists"}]}},
                "spec.template.spec.tolerations: each toleration must match one",
            ),
            "another pool's nodes": (
                {"spec": {"nodeSelector": {"team": "other"}}},
                "spec.template.spec.nodeSelector: only these node label keys",
            ),
        }
        for name, (template, message) in cases.items():
            err = attempt(template)
            assert policy in err and message in err, f"{name}: {err!r}"
        allowed = {
            "spec": {
                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "lustre"}}],
                "containers": [
                    {
                        "name": "x",
                        "image": "registry.example/exporter:1",
                        "imagePullPolicy": "Always",
                    }
                ],
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "nodeSelector": {"nvidia.com/gpu.product": "H100"},
            }
        }
        assert attempt(allowed) == ""
    finally:
        cluster.helm("uninstall", release, "-n", namespace, check=False)


def test_the_multi_tenant_profile_holds_what_a_template_can_reach(
    cluster: Cluster, namespace: str, custom: Any
) -> None:
    """The chart's multi-tenant profile on the apiserver: a template reaching other tenants (a
    pod affinity term over every namespace, node labels outside the allow-list), the node (a
    privileged root init container, an unlisted RuntimeClass, a hostPort), storage outside the
    namespace (NFS, an ephemeral claim bound to a named volume) or an unlisted registry (an
    image volume, an uppercase registry host), and a job at a system priority, are each refused
    naming the field; a plain template is accepted."""
    release = "mt"
    cluster.helm(
        "install", release, CHART, "-n", namespace, "--wait=false",
        "-f", str(REPO / "charts" / "megatron-operator" / "values-multi-tenant.yaml"),
        "--set", "crds.install=false", "--set", "clusterWide=true",
        "--set", "admissionPolicy.images.allowed={registry.example/*,docker.io/*}",
    )  # fmt: skip
    policy = f"{release}-megatron-operator-limits"
    try:

        def attempt(template: dict[str, Any], **spec: Any) -> str:
            doc = tiny_gpu_job(
                "mt", nodes=1, image="registry.example/trainer:1", imagePullPolicy="Always",
                template=template, **spec,
            )  # fmt: skip
            proc = cluster.kubectl(
                "create", "--dry-run=server", "-n", namespace, "-f", "-",
                input=yaml.safe_dump(doc), check=False,
            )  # fmt: skip
            return "" if proc.returncode == 0 else proc.stderr

        def sidecar(**fields: Any) -> dict[str, Any]:
            c = {"name": "x", "image": "registry.example/x:1", "imagePullPolicy": "Always"}
            return {"spec": {"initContainers": [{**c, **fields}]}}

        node_term = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["b"]}]}
        term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/os"}
        image = {"reference": "evil.example/payload:1", "pullPolicy": "Always"}
        claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        deadline = time.monotonic() + 30  # the apiserver loads a new policy within seconds
        while not attempt({}, priorityClassName="system-node-critical"):
            assert time.monotonic() < deadline, "the policy never took effect"
            time.sleep(0.5)
        cases: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
            "anti-affinity over every namespace": (
                {"spec": {"affinity": {"podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {**term, "namespaceSelector": {}}]}}}},
                {},
                "spec.template.spec.affinity.podAntiAffinity."
                "requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector",
            ),
            "node affinity to another pool": (
                {"spec": {"affinity": {"nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [node_term]}}}}},
                {},
                "spec.template.spec.affinity.nodeAffinity: only these node label keys",
            ),
            "node affinity by node name": (
                {"spec": {"affinity": {"nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {
                        "matchFields": [{"key": "metadata.name", "operator": "In",
                                         "values": ["node-1"]}]}}]}}}},
                {},
                "matchFields (node names) never",
            ),
            "privileged root init container": (
                sidecar(securityContext={"privileged": True, "runAsUser": 0}),
                {},
                "spec.template.spec.initContainers[0].securityContext.privileged",
            ),
            "hostPort": (
                sidecar(ports=[{"containerPort": 80, "hostPort": 80}]),
                {},
                "spec.template.spec.initContainers[0].ports[0].hostPort",
            ),
            "a RuntimeClass": (
                {"spec": {"runtimeClassName": "nvidia"}},
                {},
                "spec.template.spec.runtimeClassName is not allowed in this cluster",
            ),
            "an image volume from elsewhere": (
                {"spec": {"volumes": [{"name": "v", "image": image}]}},
                {},
                "an image volume's reference, is not from an allowed repository",
            ),
            "an image volume from a node's cache": (
                {"spec": {"volumes": [{"name": "v", "image": {
                    "reference": "registry.example/data:1", "pullPolicy": "IfNotPresent"}}]}},
                {},
                "each image volume pullPolicy Always",
            ),
            # Docker Hub is allowed; `Evilhost/x` is not a Hub path but the registry Evilhost.
            "an uppercase registry host": (
                sidecar(image="Evilhost/x:1"),
                {},
                "is not from an allowed repository",
            ),
            "NFS": (
                {"spec": {"volumes": [{"name": "v", "nfs": {"server": "10.0.0.1", "path": "/"}}]}},
                {},
                "spec.template.spec.volumes: only these volume types are allowed",
            ),
            "an ephemeral claim bound to a named volume": (
                {"spec": {"volumes": [{"name": "v", "ephemeral": {"volumeClaimTemplate": {
                    "spec": {**claim, "volumeName": "pv-of-team-b"}}}}]}},
                {},
                "an ephemeral volume may not name a PersistentVolume",
            ),
            "a system priority": ({}, {"priorityClassName": "system-node-critical"},
                                  "spec.priorityClassName system-node-critical is for the cluster"),
            "an unlisted priority": ({}, {"priorityClassName": "urgent"},
                                     "spec.priorityClassName urgent is not allowed here"),
        }  # fmt: skip
        by_the_crd = {"anti-affinity over every namespace", "privileged root init container",
                      "hostPort"}  # fmt: skip
        for name, (template, spec, message) in cases.items():
            err = attempt(template, **spec)
            assert message in err, f"{name}: {err!r}"
            assert (policy in err) != (name in by_the_crd), f"{name}: {err!r}"
        plain = {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "volumes": [
                    {"name": "d", "persistentVolumeClaim": {"claimName": "lustre"}},
                    {"name": "s", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}},
                    {"name": "m", "image": {"reference": "registry.example/data:1",
                                            "pullPolicy": "Always"}},
                ],
                **sidecar(restartPolicy="Always")["spec"],
                "affinity": {
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 10, "podAffinityTerm": term}]},
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In",
                             "values": ["H100"]}]}]}},
                },
                "securityContext": {"runAsUser": 2000, "fsGroup": 2000},
            },
        }  # fmt: skip
        assert attempt(plain, priorityClassName="training") == ""
    finally:
        cluster.helm("uninstall", release, "-n", namespace, check=False)
