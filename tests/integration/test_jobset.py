"""JobSet in the local control plane (`cluster up --jobset`), the peer of
benchmarks/peer_jobset.py: its webhooks answer, and its failure policy recreates the gang.

Opt-in (MEGATRON_JOBSET=1): JobSet is built on demand, a module graph of its own (Kubernetes
0.36 libraries) that costs several minutes of a cold build, which CI does not pay for a peer
that only the benchmark uses.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Cluster, run_driver, start_cluster

JOBSET_ENV = "MEGATRON_JOBSET"
NS = "peer"
LABEL = "jobset.sigs.k8s.io/jobset-name"
ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"

# One xdist worker for the module: its JobSet cluster (a module fixture) is started once.
pytestmark = pytest.mark.xdist_group("jobset")


@pytest.fixture(scope="module")
def jobset_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.environ.get(JOBSET_ENV) != "1":
        pytest.skip(f"JobSet is opt-in: {JOBSET_ENV}=1 (built on demand, several minutes cold)")
    run_driver("build", "--jobset", timeout=3600)
    cluster = start_cluster(
        tmp_path_factory.mktemp("jobset"), ["--nodes", "4", "--nodes-per-rack", "2", "--jobset"]
    )
    try:
        cluster.kubectl("create", "namespace", NS)
        yield cluster
    finally:
        cluster.down()


def gang(name: str, pods: int) -> dict[str, Any]:
    """As benchmarks/peer_jobset.py shapes it: one replicated Job of indexed pods, no pod
    retries, the gang recreated on failure; spec.network left to the defaulting webhook."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "failurePolicy": {"maxRestarts": 3},
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": pods,
                            "completions": pods,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [
                                        {
                                            "name": "trainer",
                                            "image": "trainer:peer",
                                            "resources": {
                                                "requests": {"nvidia.com/gpu": "8"},
                                                "limits": {"nvidia.com/gpu": "8"},
                                            },
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def running(cluster: Cluster, name: str, attempt: int, pods: int) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = cluster.kubectl_json(
            "get", "pods", "-n", NS, "-l", f"{LABEL}={name},{ATTEMPT}={attempt}"
        )["items"]
        up = [p for p in items if p["status"].get("phase") == "Running"]
        return up if len(up) == pods else None

    result: list[dict[str, Any]] = cluster.wait(
        check, 120, 1, f"{pods} Running pods of {name} attempt {attempt}"
    )
    return result


def test_jobset_webhooks_default_and_validate(jobset_cluster: Cluster) -> None:
    c = jobset_cluster
    c.apply(gang("hooks", 2))
    js = c.kubectl_json("get", "jobset", "-n", NS, "hooks")
    # Set by JobSet's defaulting webhook (the request left spec.network out).
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert js["spec"]["successPolicy"]["operator"] == "All"
    # Refused by its validating webhook (the CRD schema allows it): dependsOn on the first
    # replicated job.
    bad = gang("bad", 1)
    bad["spec"]["replicatedJobs"][0]["dependsOn"] = [{"name": "node", "status": "Ready"}]
    proc = c.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0, proc.stdout
    assert "DependsOn can't be set for the first ReplicatedJob" in proc.stderr, proc.stderr
    c.kubectl("delete", "jobset", "-n", NS, "hooks", "--wait=true")


def test_jobset_recreates_the_gang_when_a_pod_fails(jobset_cluster: Cluster) -> None:
    c = jobset_cluster
    c.apply(gang("gang", 4))
    first = running(c, "gang", 0, 4)
    assert len({p["spec"]["nodeName"] for p in first}) == 4
    victim = next(
        p["metadata"]["name"]
        for p in first
        if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    )
    c.fail_pod(NS, victim)
    again = running(c, "gang", 1, 4)
    assert not {p["metadata"]["uid"] for p in again} & {p["metadata"]["uid"] for p in first}
    js = c.kubectl_json("get", "jobset", "-n", NS, "gang")
    assert js["status"]["restarts"] == 1
    c.kubectl("delete", "jobset", "-n", NS, "gang", "--wait=true")
