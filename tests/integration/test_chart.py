"""The Helm chart: it lints, renders valid Kubernetes objects, and installs on the cluster."""

from __future__ import annotations

import kubernetes_validate
import yaml

from .conftest import REPO, Cluster

CHART = str(REPO / "charts" / "megatron-operator")


def test_chart_lints_and_renders_valid_objects(cluster: Cluster) -> None:
    cluster.helm("lint", CHART, "--strict")
    out = cluster.helm(
        "template",
        "mo",
        CHART,
        "-n",
        "megatron-system",
        "--include-crds",
        "--set",
        "watchNamespaces={team-a,team-b}",
    ).stdout
    objs = [o for o in yaml.safe_load_all(out) if o]
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    for obj in objs:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "operator"
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    crd = next(o for o in objs if o["kind"] == "CustomResourceDefinition")
    on_disk = yaml.safe_load((REPO / "crds" / "megatronjobs.megatron.dev.yaml").read_text())
    assert crd == on_disk


def test_chart_installs_and_uninstalls(cluster: Cluster, namespace: str) -> None:
    cluster.helm("install", "mo", CHART, "-n", namespace, "--wait=false")
    try:
        deploy = cluster.kubectl_json("get", "deployment", "-n", namespace, "mo-megatron-operator")
        assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "mo-megatron-operator"
        cluster.kubectl("get", "clusterrole", "mo-megatron-operator")
        cluster.kubectl("get", "crd", "megatronjobs.megatron.dev")
        # The operator's ServiceAccount may do what the operator does, and no more.
        sa = f"system:serviceaccount:{namespace}:mo-megatron-operator"

        def can(*args: str) -> str:
            return cluster.kubectl("auth", "can-i", *args, f"--as={sa}", check=False).stdout.strip()

        assert can("create", "pods", "-n", "default") == "yes"
        assert can("update", "megatronjobs/status", "-n", "default") == "yes"
        assert can("watch", "nodes") == "yes"
        assert can("get", "secrets", "-n", "default") == "no"
        assert can("delete", "nodes") == "no"
    finally:
        cluster.helm("uninstall", "mo", "-n", namespace)
