"""The in-process `kubectl get -o json` (kubeget.py) answers as kubectl does, on the real apiserver:
the same objects, the same list shape, the same exit code and error line; anything it does not
know how to answer is left to kubectl."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from .cluster_support import Cluster
from .kubeget import parse


def real_kubectl(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.kubectl_path), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def shape(doc: dict[str, Any]) -> Any:
    """What must agree (resourceVersions may move between the two reads)."""
    if doc.get("kind") == "List":
        return (
            "List",
            doc["apiVersion"],
            sorted(
                (i["apiVersion"], i["kind"], i["metadata"].get("namespace"), i["metadata"]["name"])
                for i in doc["items"]
            ),
        )
    return (doc["apiVersion"], doc["kind"], doc["metadata"]["name"], sorted(doc))


def test_get_answers_as_kubectl_does(cluster: Cluster, namespace: str) -> None:
    assert cluster.reader is not None
    cluster.kubectl("create", "configmap", "one", "-n", namespace, "--from-literal=a=b")
    cluster.kubectl("label", "configmap", "one", "-n", namespace, "pick=yes")
    queries = [
        ("get", "nodes", "-o", "json"),
        ("get", "node", cluster.nodes[0], "-o", "json"),
        ("get", "nodes", "-l", f"{cluster.rack_key}", "-o", "json"),
        ("get", "configmaps", "-n", namespace, "-o", "json"),
        ("get", "cm", "-n", namespace, "-l", "pick=yes", "-o", "json"),
        ("get", "configmap/one", "-n", namespace, "-o", "json"),
        ("get", "serviceaccount", "default", "-n", namespace, "-o", "json"),
        ("get", "pod", "-n", namespace, "missing", "-o", "json"),
        ("get", "events", "-n", namespace, "--field-selector", "type=Warning", "-o", "json"),
        ("get", "leases.coordination.k8s.io", "-n", "kube-node-lease", "-o", "json"),
        ("get", "crd", "-o", "json"),
        ("get", "namespaces", "-o", "json"),
    ]
    for args in queries:
        # Another test's namespace may go away between the two reads (the cluster is the
        # worker's): a list that differs is read again, and must agree within three tries.
        for tries in range(3):
            ours = cluster.reader.get(args)
            assert ours is not None, f"not answered in-process: {args}"
            theirs = real_kubectl(cluster, *args)
            assert ours.returncode == theirs.returncode, (args, ours.stderr, theirs.stderr)
            if theirs.returncode:
                assert ours.stderr == theirs.stderr, args
                break
            same = shape(json.loads(ours.stdout)) == shape(json.loads(theirs.stdout))
            if same or tries == 2:
                assert shape(json.loads(ours.stdout)) == shape(json.loads(theirs.stdout)), args
                break


@pytest.mark.parametrize(
    "args",
    [
        ("get", "pods", "-o", "yaml"),
        ("get", "pods", "a", "b", "-o", "json"),
        ("get", "pods,services", "-o", "json"),
        ("get", "pods", "--sort-by=.metadata.name", "-o", "json"),
        ("get", "pods"),
        ("describe", "pod", "x"),
    ],
)
def test_what_it_cannot_answer_goes_to_kubectl(args: tuple[str, ...]) -> None:
    assert parse(args) is None
