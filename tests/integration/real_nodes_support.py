"""Fixtures and helpers for tests on real nodes (`cluster up --real-nodes N`).

A real node is a network namespace with its own containerd and kubelet (tests/cluster/nodes.py);
the images come from `cluster images` and are imported into every node, so pods use them with
imagePullPolicy IfNotPresent and no registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Cluster, build_paths, start_cluster

REAL_LABEL = "megatron.dev/test-node"
# Real nodes are opt-in: they need root, containerd, runc, buildah, debootstrap and the CNI
# plugins (Debian packages), about 40 GB of disk and ~25 min, and the cold build of their
# images and binaries does not fit CI's budget yet (docs/e2e.md says why, with the figures).
REAL_NODES_ENV = "MEGATRON_REAL_NODES"
HOSTNAME_LABEL = "kubernetes.io/hostname"


class RealCluster(Cluster):
    """A Cluster started with real nodes; `real` is cluster.json's "real_nodes"."""

    @property
    def real(self) -> dict[str, Any]:
        real: dict[str, Any] = self.info["real_nodes"]
        return real

    @property
    def real_nodes(self) -> list[str]:
        return [n["name"] for n in self.real["nodes"]]

    def image(self, name: str) -> str:
        return str(self.real["images"][name]["ref"])

    def kill_container(self, namespace: str, pod: str, signal: str = "KILL") -> dict[str, str]:
        out = self.driver("kill-container", f"{namespace}/{pod}", "--signal", signal)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def kill_process(
        self, namespace: str, pod: str, match: str, signal: str = "KILL", **env: str
    ) -> dict[str, str]:
        """Signal one process inside the pod's container (e.g. one rank), not the container."""
        flags = [f"--env={k}={v}" for k, v in env.items()]
        out = self.driver(
            "kill-process", f"{namespace}/{pod}", "--match", match, "--signal", signal, *flags
        )
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def kill_node(self, name: str, timeout: int = 120) -> str:
        return str(self.driver("kill-node", name, "--timeout", str(timeout), timeout=timeout + 30))

    def logs(self, namespace: str, pod: str) -> str:
        return str(self.kubectl("logs", "-n", namespace, pod).stdout)

    def wait_pod_done(self, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        result: dict[str, Any] = self.wait(done, timeout, 0.5, f"pod {namespace}/{name} to finish")
        return result


def real_cluster_with(real_nodes: int) -> Iterator[RealCluster]:
    """A cluster of 1 kwok node and `real_nodes` real ones, with a short node-monitor grace
    period (so a killed node is NotReady in ~15 s); downed at the end."""
    if os.environ.get(REAL_NODES_ENV) != "1":
        pytest.skip(
            f"real nodes are opt-in: {REAL_NODES_ENV}=1 (root, containerd, buildah, ~40 GB of "
            "disk, ~25 min); not in CI yet, see docs/e2e.md"
        )
    build_paths()
    state = Path(tempfile.mkdtemp(prefix="megatron-real-"))
    c = start_cluster(
        state,
        [
            "--nodes",
            "1",
            "--gpus-per-node",
            "0",
            "--nodes-per-rack",
            "2",
            "--real-nodes",
            str(real_nodes),
            "--node-monitor-grace-period",
            "15",
            "--timeout",
            "900",
        ],
        timeout=1000,
    )
    rc = RealCluster(state_dir=c.state_dir, info=c.info)
    try:
        yield rc
    finally:
        rc.down()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[RealCluster]:
    """One cluster per test module with 2 real nodes. The last test of a module may down it."""
    yield from real_cluster_with(2)


def pod(
    name: str,
    image: str,
    node: str,
    command: list[str],
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A one-container pod pinned to a real node, as the trainer's pods run (uid 1000)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {REAL_LABEL: "real", HOSTNAME_LABEL: node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
                }
            ],
            **spec,
        },
    }


def python_pod(name: str, image: str, node: str, code: str, **kw: Any) -> dict[str, Any]:
    return pod(name, image, node, ["python", "-c", code], **kw)


def netns_list() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p.startswith(prefix)]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name `text` (e.g. the state directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in argv:
            found.append(f"{proc.name}: {argv[:200]}")
    return found


def cluster_json(state: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state / "cluster.json").read_text())
    return data
