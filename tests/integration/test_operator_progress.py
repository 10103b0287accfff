"""The trainer's progress channel: one Lease per job, written by rank 0 as the job's trainer
ServiceAccount, read by the operator (issue 15, least privilege).

- The trainer identity can update its own job's Lease and nothing else (a `kubectl auth can-i`
  matrix, and real writes with a token of that ServiceAccount).
- The trainer's own writer (`LeaseWriter`) updates the Lease on the real apiserver with that token.
- The operator copies the record into status.progress, and a renewTime that stops moving
  triggers the hang rule.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from megatron_contract.paths import PROGRESS_ANNOTATION
from megatron_trainer.progress import LeaseWriter, Report

from .conftest import Cluster
from .operator_support import (
    Op,
    operator,  # noqa: F401 - fixture
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)


def _lease(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = cluster.kubectl_json("get", "lease", "-n", ns, name)
    return doc


def _wait_lease(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        proc = cluster.kubectl("get", "lease", "-n", ns, name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    result: dict[str, Any] = cluster.wait(check, 30, what=f"lease {ns}/{name}")
    return result


def _ca_file(cluster: Cluster, tmp_path: Path) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    data = config["clusters"][0]["cluster"]["certificate-authority-data"]
    path = tmp_path / "ca.crt"
    path.write_bytes(base64.b64decode(data))
    return path


def _token_file(cluster: Cluster, ns: str, account: str, tmp_path: Path) -> Path:
    token = cluster.kubectl("create", "token", account, "-n", ns).stdout.strip()
    path = tmp_path / f"{account}.token"
    path.write_text(token)
    return path


def test_trainer_identity_can_write_only_its_own_progress_lease(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("rbac", nodes=2), ns)
    wait_pods(cluster, ns, "rbac", 2)
    cluster.apply(tiny_gpu_job("other", nodes=1), ns)
    wait_pods(cluster, ns, "other", 1)
    lease = _wait_lease(cluster, ns, "rbac-progress")
    owner = lease["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("MegatronJob", "rbac", True)
    _wait_lease(cluster, ns, "other-progress")
    sa = f"system:serviceaccount:{ns}:rbac-trainer"

    def can(*args: str) -> str:
        proc = cluster.kubectl("auth", "can-i", *args, f"--as={sa}", check=False)
        return proc.stdout.strip()

    matrix = {
        ("update", "leases/rbac-progress", ns): "yes",
        ("patch", "leases/rbac-progress", ns): "yes",
        ("get", "leases/rbac-progress", ns): "yes",
        ("update", "leases/other-progress", ns): "no",  # another job's Lease
        ("patch", "leases/other-progress", ns): "no",
        ("delete", "leases/rbac-progress", ns): "no",
        ("create", "leases", ns): "no",
        ("list", "leases", ns): "no",
        ("update", "leases/rbac-progress", "default"): "no",
        ("patch", "pods/rbac-0", ns): "no",  # no pod verb any more
        ("update", "pods/rbac-0", ns): "no",
        ("get", "pods/rbac-0", ns): "no",
        ("create", "pods", ns): "no",
        ("delete", "pods/rbac-0", ns): "no",
        ("get", "secrets", ns): "no",
        ("patch", "services/rbac", ns): "no",
        ("patch", "megatronjobs/rbac", ns): "no",
        ("update", "megatronjobs/rbac", ns): "no",
    }
    got = {key: can(key[0], key[1], "-n", key[2]) for key in matrix}
    assert got == matrix

    # And for real, as that identity: its own Lease takes a write, a pod and another Lease don't.
    ok = cluster.kubectl(
        "annotate", "lease", "-n", ns, "rbac-progress", "--overwrite", f"--as={sa}", "probe=1"
    )
    assert ok.returncode == 0
    for target in (("lease", "other-progress"), ("pod", "rbac-0")):
        refused = cluster.kubectl(
            "annotate", *target, "-n", ns, "--overwrite", f"--as={sa}", "probe=1", check=False
        )
        assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr


def test_the_trainer_writer_updates_the_lease_with_its_service_account_token(
    cluster: Cluster, namespace: str, operator: Op, tmp_path: Path
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("writer", nodes=1), ns)
    wait_pods(cluster, ns, "writer", 1)
    _wait_lease(cluster, ns, "writer-progress")
    token = _token_file(cluster, ns, "writer-trainer", tmp_path)
    ca = _ca_file(cluster, tmp_path)

    def write(lease: str, report: Report, attempt: int) -> LeaseWriter:
        w = LeaseWriter(
            cluster.server, ns, lease, "writer-0", PROGRESS_ANNOTATION, str(token), str(ca)
        )
        w.submit(report.to_json(attempt))
        w.close(timeout=10)
        return w

    before = datetime.now(UTC)
    w = write("writer-progress", Report(12, 4.5, 900.0, None, 10), 0)
    assert (w.sent, w.failed) == (1, 0)
    lease = _lease(cluster, ns, "writer-progress")
    record = json.loads(lease["metadata"]["annotations"][PROGRESS_ANNOTATION])
    assert (record["attempt"], record["iteration"], record["checkpointIteration"]) == (0, 12, 10)
    assert lease["spec"]["holderIdentity"] == "writer-0"
    renew = datetime.strptime(lease["spec"]["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert renew.replace(tzinfo=UTC) >= before - timedelta(seconds=1)
    assert lease["metadata"]["labels"]["megatron.dev/job-name"] == "writer"  # kept
    # The operator follows it.
    cluster.wait(
        lambda: (status(cluster, ns, "writer").get("progress") or {}).get("iteration") == 12,
        30,
        what="status.progress from the Lease",
    )
    # The same token cannot write another job's Lease (the apiserver answers 403).
    cluster.apply(tiny_gpu_job("victim", nodes=1), ns)
    _wait_lease(cluster, ns, "victim-progress")
    refused = write("victim-progress", Report(1, 1.0, 1.0, None, None), 0)
    assert (refused.sent, refused.failed) == (0, 1)
    victim = _lease(cluster, ns, "victim-progress")
    assert PROGRESS_ANNOTATION not in (victim["metadata"].get("annotations") or {})


def _write_record(
    cluster: Cluster, ns: str, lease: str, iteration: int, attempt: int, renew: datetime
) -> None:
    """What rank 0 writes, done with kubectl as the trainer's own ServiceAccount."""
    record = {
        "attempt": attempt,
        "iteration": iteration,
        "loss": 3.25,
        "tokensPerSecond": 1000.0,
        "mfu": 0.4,
        "checkpointIteration": None,
        "time": renew.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    patch = {
        "metadata": {"annotations": {PROGRESS_ANNOTATION: json.dumps(record)}},
        "spec": {
            "holderIdentity": f"{lease.removesuffix('-progress')}-0",
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }
    job = lease.removesuffix("-progress")
    cluster.kubectl(
        "patch", "lease", "-n", ns, lease, "--type=merge", "-p", json.dumps(patch),
        f"--as=system:serviceaccount:{ns}:{job}-trainer",
    )  # fmt: skip


def test_progress_follows_the_lease_and_a_stale_renew_time_is_a_hang(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    # 20 s: each heartbeat below is a kubectl call, which takes seconds on a loaded machine; a
    # gap between two of them longer than the timeout would be a real hang to the operator.
    cluster.apply(tiny_gpu_job("hang", nodes=2, restartPolicy={"hangTimeoutSeconds": 20}), ns)
    wait_pods(cluster, ns, "hang", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "hang", "Running")
    # Fresh heartbeats keep it alive well past the timeout, and status.progress follows.
    for i in range(6):
        _write_record(cluster, ns, "hang-progress", 10 + i, 0, datetime.now(UTC))
        time.sleep(2)
    # Copied at most every 10 s per job (cluster/ratelimit.py): the newest lands within that.
    cluster.wait(
        lambda: status(cluster, ns, "hang")["progress"]["iteration"] == 15,
        12,
        what="the newest record in status.progress",
    )
    st = status(cluster, ns, "hang")
    assert st["phase"] == "Running" and st["restarts"] == 0
    assert st["progressSummary"].startswith("15/100")
    assert "15/100" in cluster.kubectl("get", "mj", "-n", ns, "hang").stdout
    # Then the renewTime stops moving: the job restarts with reason Hang.
    _write_record(cluster, ns, "hang-progress", 16, 0, datetime.now(UTC) - timedelta(hours=1))
    started = time.monotonic()
    wait_pods(cluster, ns, "hang", 2, attempt=1, timeout=60)
    st = status(cluster, ns, "hang")
    assert st["lastFailure"]["reason"] == "Hang", st["lastFailure"]
    assert "hangTimeoutSeconds 20" in st["lastFailure"]["message"]
    assert st["restartsCounted"] == 1
    assert time.monotonic() - started < 30
    # Attempt 1 runs. A late write of attempt 0 (a pod still stopping) is not its progress;
    # its own record is.
    wait_pods(cluster, ns, "hang", 2, phase="Running", attempt=1, timeout=30)
    _write_record(cluster, ns, "hang-progress", 99, 0, datetime.now(UTC))
    time.sleep(1.5)
    assert status(cluster, ns, "hang")["progress"]["iteration"] == 15
    _write_record(cluster, ns, "hang-progress", 3, 1, datetime.now(UTC))
    cluster.wait(
        lambda: status(cluster, ns, "hang")["progress"]["iteration"] == 3,
        15,
        what="attempt 1's record in status.progress",
    )
    # The goodput ledger in the status the real apiserver keeps (its schema prunes nothing of
    # it): it sums to the wall time, the hang's wait is counted, and `kubectl get mj` shows it.
    # These records carry no `clock` (an older trainer's): read as before.
    led = status(cluster, ns, "hang")["ledger"]
    assert abs(sum(led["seconds"].values()) - led["wallSeconds"]) < 1e-3, led
    assert led["seconds"]["hangDetection"] > 0 and led["fold"]["attempt"] == 1, led
    assert led["restarts"][0]["count"] == 1, led
    assert "GOODPUT" in cluster.kubectl("get", "mj", "-n", ns, "hang").stdout
