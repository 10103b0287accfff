"""Helpers for tests on real nodes (`cluster up --real-nodes N`); the fixtures that use them,
`real_cluster` and `real_operator`, are in conftest.py (one cluster for the whole session).

A real node is a network namespace with its own containerd and kubelet (tests/cluster/realnodes.py);
the images come from `cluster images` and are imported into every node, so pods use them with
imagePullPolicy IfNotPresent and no registry.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .cluster_support import Cluster, build_paths, start_cluster

REAL_LABEL = "megatron.dev/test-node"
# Real nodes run by default (CI included): they are what shows the product working as users run
# it. MEGATRON_REAL_NODES=0 skips them, for a developer without root or the disk they take.
REAL_NODES_ENV = "MEGATRON_REAL_NODES"
SKIP_REASON = (
    f"{REAL_NODES_ENV}=0: the real-node tests are skipped on request "
    "(without it they run: root, ~6 GB of cached images; see docs/e2e.md)"
)
HOSTNAME_LABEL = "kubernetes.io/hostname"
# The session's real cluster: 1 kwok node and 3 real ones (two for a 2-pod job, one spare for
# node loss; real-node-0 also runs the operator).
REAL_NODE_COUNT = 3


# The checkpoint claim of a job on the real nodes: one volume every node mounts (the cluster's
# shared hostPath class), so a pod moved to another node finds the checkpoints.
SHARED_CHECKPOINT_VOLUME: dict[str, Any] = {
    "create": {
        "storageClassName": "shared-hostpath",
        "size": "1Gi",
        "accessModes": ["ReadWriteMany"],
    }
}


def real_nodes_requested() -> bool:
    return os.environ.get(REAL_NODES_ENV, "").strip() != "0"


REAL_FIXTURE = "real_cluster"


def uses_real_nodes(item: Any) -> bool:
    """Whether a collected test uses the session's real cluster (directly or through
    real_operator)."""
    return REAL_FIXTURE in getattr(item, "fixturenames", ())


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

    def restart_node(self, name: str, timeout: int = 120) -> str:
        """Bring a killed node back (containerd with its images, then its kubelet); waits until
        it is Ready and untainted, so the next test finds the session's cluster whole."""
        return str(
            self.driver("restart-node", name, "--timeout", str(timeout), timeout=timeout + 30)
        )

    def logs(self, namespace: str, pod: str) -> str:
        return str(self.kubectl("logs", "-n", namespace, pod).stdout)

    def wait_pod_done(self, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        result: dict[str, Any] = self.wait(done, timeout, 0.5, f"pod {namespace}/{name} to finish")
        return result


def start_real_cluster(real_nodes: int = REAL_NODE_COUNT) -> RealCluster:
    """A cluster of 1 kwok node and `real_nodes` real ones, with a short node-monitor grace
    period (a killed node is NotReady in ~15 s)."""
    if os.geteuid() != 0:
        raise RuntimeError(
            "real nodes need root (network namespaces, mounts, cgroups, containerd); "
            f"run as root, or set {REAL_NODES_ENV}=0 to skip the real-node tests"
        )
    build_paths()
    state = Path(tempfile.mkdtemp(prefix="megatron-real-"))
    try:
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
                # One fresh static volume per job: a Retained volume keeps the checkpoints of
                # the job before it (six jobs today; four, the default, ran out).
                "--pvs",
                "12",
                "--node-monitor-grace-period",
                "15",
                "--timeout",
                "900",
            ],
            timeout=1800,
        )
    except BaseException:
        shutil.rmtree(state, ignore_errors=True)
        raise
    c.close()  # the RealCluster below is the one the session keeps
    return RealCluster(state_dir=c.state_dir, info=c.info)


class EarlyStart:
    """`cluster up --real-nodes` in a thread, started as soon as the session knows it will need
    real nodes: importing the images into the nodes is minutes of disk and decompression that
    overlap the tests running before the real-node ones (which pytest runs last)."""

    def __init__(self) -> None:
        self.cluster: RealCluster | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="real-cluster-up", daemon=True)
        self.started = time.monotonic()
        self.thread.start()

    def _run(self) -> None:
        try:
            self.cluster = start_real_cluster()
        except BaseException as e:  # re-raised by result(), in the test that needs it
            self.error = e

    def result(self) -> RealCluster:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.cluster is not None
        return self.cluster


def assert_nothing_left(c: RealCluster) -> None:
    """After `down`: no process, namespace, mount, link or state file of the real nodes."""
    ours = {c.real["fabric_netns"], *(n["netns"] for n in c.real["nodes"])}
    assert ours.isdisjoint(netns_list())
    assert mounts_under(c.state_dir) == []
    assert processes_mentioning(str(c.state_dir)) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert "cni0" not in links and "br0" not in links  # nothing of ours in the root namespace
    assert not (c.state_dir / "real-nodes.json").exists()


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


OPERATOR_NS = "megatron-system"
OPERATOR_NODE = "real-node-0"
CHART = Path(__file__).resolve().parents[2] / "charts" / "megatron-operator"


def install_operator(c: RealCluster) -> Iterator[RealCluster]:
    """`helm install` of the chart, with the operator image built from Dockerfile.operator,
    pinned to real-node-0 (a test that loses a node never takes the operator with it); the
    operator's log tail is printed at the end."""
    repo, tag = c.image("operator").rsplit(":", 1)
    trainer_repo, trainer_tag = c.image("trainer").rsplit(":", 1)
    c.kubectl("create", "namespace", OPERATOR_NS)
    # The chart's default install (every namespace watched), with this machine's images: what
    # the README tour installs (tests/integration/test_e2e.py checks the two agree).
    c.helm(
        "install",
        "mo",
        str(CHART),
        "-n",
        OPERATOR_NS,
        "--set",
        f"image.repository={repo}",
        "--set",
        f"image.tag={tag}",
        "--set",
        f"trainerImage.repository={trainer_repo}",
        "--set",
        f"trainerImage.tag={trainer_tag}",
        "--set-string",
        f"nodeSelector.kubernetes\\.io/hostname={OPERATOR_NODE}",
        "--set",
        "resources.requests.cpu=100m",
        "--set",
        "nodeLostGraceSeconds=10",
        "--wait",
        "--timeout",
        "300s",
        timeout=330,
    )
    try:
        yield c
    finally:
        logs = c.kubectl(
            "logs",
            "-n",
            OPERATOR_NS,
            "-l",
            "app.kubernetes.io/name=megatron-operator",
            "--tail",
            "200",
            check=False,
        )
        print("--- operator log (tail)\n" + logs.stdout + logs.stderr, file=sys.stderr)
