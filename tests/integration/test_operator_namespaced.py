"""`mjob operator --namespace NS`: it runs jobs in its namespaces and leaves the others alone."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .conftest import Cluster
from .operator_support import Op, install_crd, pods, status, tiny_gpu_job, wait_phase, wait_pods


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"elsewhere-{int(time.time() * 1000) % 10**8}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_watches_only_its_namespaces(
    cluster: Cluster, namespace: str, other_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    install_crd(cluster)
    op = Op(cluster, tmp_path_factory.mktemp("namespaced"), f"--namespace={namespace}")
    op.start()
    try:
        cluster.apply(tiny_gpu_job("mine", nodes=1), namespace)
        cluster.apply(tiny_gpu_job("theirs", nodes=1), other_namespace)
        wait_pods(cluster, namespace, "mine", 1, phase="Running")
        wait_phase(cluster, namespace, "mine", "Running")
        # The pod watch is namespaced too: a failure is seen and restarts the gang.
        cluster.fail_pod(namespace, "mine-a0-0", exit_code=1, wait=False)
        wait_pods(cluster, namespace, "mine", 1, phase="Running", attempt=1, timeout=60)
        time.sleep(2)
        assert status(cluster, other_namespace, "theirs") == {}
        assert pods(cluster, other_namespace, "theirs") == []
        assert "Traceback" not in op.logs()
    finally:
        op.stop()
        for ns, name in ((namespace, "mine"), (other_namespace, "theirs")):
            cluster.kubectl(
                "patch",
                "mj",
                "-n",
                ns,
                name,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )
            cluster.kubectl("delete", "mj", "-n", ns, name, "--wait=false", check=False)
