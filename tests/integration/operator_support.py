"""The operator as a real process against the local control plane, plus helpers for its tests.

`operator` (module-scoped) installs the CRD, starts `mjob operator` as a subprocess (as a user
would run it), and stops it at the end. `Op` gives tests a way to kill and restart it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_contract.ports import free_port

from .cluster_support import pod_summary
from .conftest import REPO, Cluster

CRD = REPO / "crds" / "megatronjobs.megatron.dev.yaml"
DEFAULTS_CRD = REPO / "crds" / "megatronjobdefaults.megatron.dev.yaml"


class Op:
    """A running `mjob operator` process."""

    def __init__(self, cluster: Cluster, log_dir: Path, *extra: str) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self, *extra: str) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "megatron_operator.cli.main",
                "operator",
                f"--metrics-port={self.metrics_port}",
                f"--health-port={self.health_port}",
                "--node-lost-grace-seconds=5",
                *self.extra,
                *extra,
            ],
            env=self.cluster.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout: float = 180) -> None:
        """Ready when /readyz says so: kopf started and every watch has listed what exists.
        Seconds on a quiet machine; the bound is for a loaded CI machine, where starting Python
        and listing every watch once took over a minute."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the operator exited:\n{self.log_tail()}")
            if self.probe("/readyz") == 200:
                return
            time.sleep(0.2)
        raise AssertionError(f"the operator did not become ready:\n{self.log_tail()}")

    def probe(self, path: str) -> int | None:
        """The HTTP status of one of the operator's probes (None: no answer)."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}{path}", timeout=2
            ) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def logs(self) -> str:
        return "\n".join(
            (self.log_dir / f"operator-{i}.log").read_text(errors="replace")
            for i in range(1, self.starts + 1)
            if (self.log_dir / f"operator-{i}.log").exists()
        )

    def metrics(self, token: str | None = None) -> str:
        """/metrics (with a bearer token when the operator runs --metrics-auth kubernetes)."""
        import urllib.request

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.metrics_port}/metrics", headers=headers
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return str(r.read().decode())


def install_crd(cluster: Cluster) -> None:
    """Both CRDs: MegatronJob and MegatronJobDefaults (which the operator reads for new jobs)."""
    for path in (CRD, DEFAULTS_CRD):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    cluster.wait_crd_established("megatronjobs.megatron.dev")
    cluster.wait_crd_established("megatronjobdefaults.megatron.dev")


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Op]:
    install_crd(cluster)
    op = Op(cluster, tmp_path_factory.mktemp("operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()
        assert "Traceback" not in op.logs(), op.logs()[-5000:]


# --- jobs -------------------------------------------------------------------------------------
def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / f"{name}.yaml").read_text())
    return doc


def tiny_gpu_job(name: str, nodes: int = 2, **spec: Any) -> dict[str, Any]:
    """A small job on the fake GPU nodes (gpt-tiny, one pod per node, 8 GPUs each)."""
    doc: dict[str, Any] = {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name},
        "spec": {
            "image": "trainer:test",
            "model": {"recipe": "gpt-tiny"},
            "training": {"globalBatchSize": 16 * nodes, "trainIters": 100},
            "data": {"mock": True},
            "resources": {"nodes": nodes, "procsPerNode": 8},
            # The cluster's default StorageClass provisions hostPath volumes on demand.
            "checkpoint": {"volume": {"create": {"size": "1Gi"}}, "gracePeriodSeconds": 1},
            # A 2 s backoff also keeps clear of kwok, which can replay a stale delete of an old
            # pod onto the next attempt's pod of the same name within about a second. kwok's
            # pods run no launcher, so these jobs recreate the gang on any failure; the lower
            # rungs, with a test playing the launchers, are test_operator_ladder.py's.
            "restartPolicy": {"backoffSeconds": 2, "maxBackoffSeconds": 4, "strategy": "Recreate"},
        },
    }
    _merge(doc["spec"], spec)
    return doc


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def job(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = cluster.kubectl_json("get", "megatronjob", "-n", ns, name)
    return result


def status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(job(cluster, ns, name).get("status") or {})


def pods(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", ns, "-l", f"megatron.dev/job-name={name}"
    )["items"]
    return items


def wait_phase(
    cluster: Cluster, ns: str, name: str, phase: str, timeout: float = 60
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = status(cluster, ns, name)
        return st if st.get("phase") == phase else None

    try:
        result: dict[str, Any] = cluster.wait(check, timeout, what=f"{ns}/{name} phase {phase}")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; status now: {json.dumps(status(cluster, ns, name))}"
        ) from None
    return result


def wait_pods(
    cluster: Cluster,
    ns: str,
    name: str,
    count: int,
    phase: str | None = None,
    attempt: int | None = None,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        found = [
            p
            for p in pods(cluster, ns, name)
            if not p["metadata"].get("deletionTimestamp")
            and (phase is None or p.get("status", {}).get("phase") == phase)
            and (
                attempt is None
                or p["metadata"]["labels"].get("megatron.dev/restart-attempt") == str(attempt)
            )
        ]
        return found if len(found) == count else None

    what = f"{count} pods of {ns}/{name} (phase {phase}, attempt {attempt})"
    try:
        result: list[dict[str, Any]] = cluster.wait(check, timeout, what=what)
    except AssertionError as e:
        # Say where each pod stood: unscheduled (and the scheduler's reason), or on which node.
        raise AssertionError("\n".join([str(e), *pod_summary(pods(cluster, ns, name))])) from None
    return result


def events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def condition(st: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in st.get("conditions", []) if c.get("type") == type_), None)


def env_without_kubeconfig() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
