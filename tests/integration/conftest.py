"""Fixtures for integration tests against the local control plane (tests/cluster).

Every test under tests/integration is marked `integration`.

Fixtures:
- `cluster` (session): one shared cluster, up once per session and down at the end (also when
  tests fail or the session is interrupted). By default 16 fake nodes x 8 nvidia.com/gpu, racks of
  4 nodes, Kueue on. Environment variables change it (read once per session):
    MEGATRON_CLUSTER_NODES (16), MEGATRON_CLUSTER_GPUS_PER_NODE (8),
    MEGATRON_CLUSTER_NODES_PER_RACK (4), MEGATRON_CLUSTER_KUEUE (1; 0 turns Kueue off),
    MEGATRON_CLUSTER_EXTRA_ARGS (more `cluster up` options, e.g. "--kueue-pods-ready-timeout 5m"),
    MEGATRON_CLUSTER_STATE: use this state directory. If a cluster is already running there it is
      reused and left running (fast local iteration: `tests/cluster/cluster up --state DIR
      --nodes 16 --kueue` once, then run pytest with MEGATRON_CLUSTER_STATE=DIR).
- `cluster_factory` (session): `cluster_factory(nodes=2, gpus_per_node=8, kueue=False, ...)`
  starts another, private cluster (for tests that need a different shape or break things);
  every cluster it started is downed at the end of the session, or earlier with `.down()`.
- `namespace` (per test): a fresh namespace on the shared cluster, with its default
  ServiceAccount present; deleted after the test.
- `real_cluster` (session): THE cluster with real nodes (1 kwok node, 3 real ones: kubelet and
  containerd in network namespaces, our images; real_nodes_support.py), one for the whole
  session, shared by every real-node module. It is started in a background thread as soon as
  the first integration test runs (its images are imported while other tests run), and pytest
  runs every test that uses it last. Torn down at the end of the session, which then checks
  that no process, namespace, mount or link of it is left. MEGATRON_REAL_NODES=0 skips the
  tests that use it, and the skip says so.
- `real_operator` (session): `real_cluster` with the chart's operator installed (`helm install`,
  the image built from Dockerfile.operator, pinned to real-node-0).

A new real-node module asks for `real_cluster` or `real_operator` in its tests: nothing else.
Its tests share the cluster with the other modules: they work in namespaces of their own, delete
what they fill, and leave every node Ready (a test that kills a node restarts it:
`real_cluster.restart_node(name)`). Each scenario costs CI minutes; keep it to what only real
nodes can show.

The binaries are built (or found in the cache) by `tests/cluster/cluster build`, which the
`cluster` fixture runs itself: a no-op when cached, 10-30 minutes when cold.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from .cluster_support import (
    DRIVER,
    REPO,
    Cluster,
    _env_int,
    _running,
    build_paths,
    run_driver,
    start_cluster,
)
from .real_nodes_support import (
    OPERATOR_NODE,
    OPERATOR_NS,
    SKIP_REASON,
    EarlyStart,
    RealCluster,
    assert_nothing_left,
    install_operator,
    real_nodes_requested,
    uses_real_nodes,
)

__all__ = [
    "DRIVER",
    "OPERATOR_NODE",
    "OPERATOR_NS",
    "REPO",
    "Cluster",
    "build_paths",
    "run_driver",
    "start_cluster",
]

INTEGRATION_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration `integration` (before -m selects), and order
    the real-node tests (in their modules' order):
    - in a one-process run, last: the real cluster starts in the background while the others
      run;
    - under xdist, first: they are one group, which xdist hands out in collection order, and
      the longest piece of work (a cluster up, then ~12 scenarios) must start at once, not
      when the other workers are nearly done."""
    for item in items:
        if INTEGRATION_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)
    first = bool(getattr(config.option, "loadgroup", False)) or config.getoption(
        "dist", "no"
    ) not in ("no", None)
    items.sort(key=lambda item: uses_real_nodes(item) != first)  # stable: the rest keep order


_EARLY = pytest.StashKey[EarlyStart]()


def start_real_cluster_early(session: pytest.Session, now: bool = False) -> None:
    """Start the real cluster in the background if this session has real-node tests to run.
    Under xdist only the worker that runs them starts it (`now`, from the fixture): there they
    have a worker of their own from the start (tests/conftest.py's groups)."""
    if _EARLY in session.stash or not real_nodes_requested():
        return
    if now or (
        not hasattr(session.config, "workerinput") and any(map(uses_real_nodes, session.items))
    ):
        session.stash[_EARLY] = EarlyStart()


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    start_real_cluster_early(request.session)
    build_paths()
    reuse = os.environ.get("MEGATRON_CLUSTER_STATE", "").strip()
    if reuse and _running(Path(reuse).resolve()):
        state = Path(reuse).resolve()
        yield Cluster(state, json.loads((state / "cluster.json").read_text()), owned=False)
        return
    state = Path(reuse).resolve() if reuse else tmp_path_factory.mktemp("cluster")
    args = [
        "--nodes",
        str(_env_int("MEGATRON_CLUSTER_NODES", 16)),
        "--gpus-per-node",
        str(_env_int("MEGATRON_CLUSTER_GPUS_PER_NODE", 8)),
        "--nodes-per-rack",
        str(_env_int("MEGATRON_CLUSTER_NODES_PER_RACK", 4)),
    ]
    if _env_int("MEGATRON_CLUSTER_KUEUE", 1):
        args.append("--kueue")
    args += shlex.split(os.environ.get("MEGATRON_CLUSTER_EXTRA_ARGS", ""))
    c = start_cluster(state, args)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="session")
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """cluster_factory(nodes=2, gpus_per_node=8, nodes_per_rack=2, kueue=False, state_dir=None)"""
    started: list[Cluster] = []
    tmp_dirs: list[Path] = []

    def make(
        nodes: int = 2,
        gpus_per_node: int = 8,
        nodes_per_rack: int = 2,
        kueue: bool = False,
        state_dir: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> Cluster:
        build_paths()
        if state_dir is None:
            state_dir = Path(tempfile.mkdtemp(prefix="megatron-cluster-"))
            tmp_dirs.append(state_dir)
        args = [
            "--nodes",
            str(nodes),
            "--gpus-per-node",
            str(gpus_per_node),
            "--nodes-per-rack",
            str(nodes_per_rack),
            *extra_args,
        ]
        if kueue:
            args.append("--kueue")
        c = start_cluster(state_dir, args)
        started.append(c)
        return c

    try:
        yield make
    finally:
        errors = []
        for c in reversed(started):
            try:
                c.down()
            except Exception as e:  # keep downing the others
                errors.append(str(e))
        for d in tmp_dirs:
            shutil.rmtree(d, ignore_errors=True)
        if errors:
            raise RuntimeError("; ".join(errors))


def _dns_label(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-") or "t"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount), deleted after the test."""
    name = f"{_dns_label(request.node.name, 40)}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait(
        lambda: (
            cluster.kubectl(
                "get", "serviceaccount", "default", "-n", name, "-o", "json", check=False
            ).returncode
            == 0
        ),
        timeout=30,
        what=f"the default ServiceAccount of {name}",
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A real cluster started early whose tests never ran (deselected, -x): down it too."""
    early = session.stash.get(_EARLY, None)
    if early is None:
        return
    early.thread.join()
    c = early.cluster
    if c is not None and c.state_dir.exists():
        c.down()
        shutil.rmtree(c.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[RealCluster]:
    """The session's one cluster with real nodes (see the module docstring)."""
    if not real_nodes_requested():
        pytest.skip(SKIP_REASON)
    start_real_cluster_early(request.session, now=True)
    c = request.session.stash[_EARLY].result()
    try:
        yield c
    finally:
        c.down()
        try:
            assert_nothing_left(c)
        finally:
            shutil.rmtree(c.state_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def real_operator(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """`helm install` of the chart, with the operator image built from Dockerfile.operator,
    pinned to real-node-0 (a test that loses a node never takes the operator with it)."""
    yield from install_operator(real_cluster)
