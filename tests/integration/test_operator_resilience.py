"""The operator under refusal, with replicas, and across restarts (issue 15: errors surface,
restart safety, HA), on the real control plane."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

from .conftest import Cluster
from .operator_support import (
    Op,
    condition,
    events,
    install_crd,
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)


def _api_errors(op: Op, kind: str) -> float:
    text = op.metrics()
    match = re.search(
        rf'^megatron_operator_api_errors_total\{{kind="{kind}"\}} (\S+)$', text, re.MULTILINE
    )
    return float(match.group(1)) if match else 0.0


def test_a_quota_refusal_shows_on_the_job_and_backs_off(
    cluster: Cluster, namespace: str, tmp_path_factory: Any
) -> None:
    install_crd(cluster)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-pods"},
            "spec": {"hard": {"pods": "0"}},
        },
        namespace,
    )
    op = Op(cluster, tmp_path_factory.mktemp("quota"))
    op.start()
    try:
        applied = time.monotonic()
        cluster.apply(tiny_gpu_job("quota", nodes=2), namespace)

        def refused() -> dict[str, Any] | None:
            cond = condition(status(cluster, namespace, "quota"), "CreateFailure")
            return cond if cond and cond["status"] == "True" else None

        cond = cluster.wait(refused, 10, what="the CreateFailure condition")
        took = time.monotonic() - applied
        assert cond["reason"] == "FailedCreate"
        assert "403" in cond["message"] and "exceeded quota" in cond["message"], cond
        warned = cluster.wait(
            lambda: [
                e for e in events(cluster, namespace, "quota") if e["reason"] == "FailedCreate"
            ],
            10,
            what="the FailedCreate event",
        )
        assert "exceeded quota" in warned[0]["message"]
        print(f"refusal on the job {took:.1f} s after apply")

        # The retries back off: a flat 5 s retry would make 12 refused calls a minute; 1, 2, 4,
        # 8, 16, 32 s (jittered down to half at most) make at most 8.
        first = _api_errors(op, "Forbidden")
        time.sleep(60)
        refused_calls = _api_errors(op, "Forbidden") - first
        assert 1 <= refused_calls <= 8, refused_calls
        assert len(events(cluster, namespace, "quota")) < 20  # one event per change, not per retry

        # Lift the quota: the next retry (at most the 120 s cap away) creates the pods, and the
        # condition clears.
        cluster.kubectl("delete", "resourcequota", "-n", namespace, "no-pods")
        wait_pods(cluster, namespace, "quota", 2, timeout=150)
        cluster.wait(
            lambda: (
                (condition(status(cluster, namespace, "quota"), "CreateFailure") or {}).get(
                    "status"
                )
                == "False"
            ),
            30,
            what="the condition cleared",
        )
        assert "Traceback" not in op.logs()
    finally:
        op.stop()


def _reconciles(op: Op) -> float:
    """Reconciles this operator process has made (its histogram's count)."""
    try:
        text = op.metrics()
    except OSError:  # not serving yet
        return 0.0
    match = re.search(r"^megatronjob_reconcile_duration_seconds_count (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _lease_holder(cluster: Cluster, namespace: str) -> str:
    lease = cluster.kubectl_json("get", "lease", "-n", namespace, "megatron-operator")
    return str(lease["spec"].get("holderIdentity") or "")


def test_two_replicas_one_leads_and_the_other_takes_over(
    cluster: Cluster, namespace: str, tmp_path_factory: Any
) -> None:
    install_crd(cluster)
    flags = ("--leader-elect", f"--leader-election-namespace={namespace}")
    first = Op(cluster, tmp_path_factory.mktemp("leader-a"), *flags)
    second = Op(cluster, tmp_path_factory.mktemp("leader-b"), *flags)
    first.start()
    second.start()  # ready as a standby: a rollout must not wait for it to lead
    try:
        holder = _lease_holder(cluster, namespace)
        assert holder, "nobody holds the Lease"
        # A standby is ready before its first look at the Lease (readiness says "standby"), so
        # its "standing by" line may come a moment after start() returns.
        standby = cluster.wait(
            lambda: next((op for op in (first, second) if "standing by" in op.logs()), None),
            30,
            what="one replica to stand by",
        )
        leader = first if standby is second else second
        assert "leading" in leader.logs()

        cluster.apply(tiny_gpu_job("ha-a"), namespace)
        wait_pods(cluster, namespace, "ha-a", 2, timeout=60)
        assert "created 2 pods" in leader.logs() and "created 2 pods" not in standby.logs()

        # A clean stop hands the Lease back: the standby leads within a few seconds, not a
        # whole lease duration, and reconciles new work without touching the running job.
        uids = {p["metadata"]["uid"] for p in pods(cluster, namespace, "ha-a")}
        stopped = time.monotonic()
        leader.kill(signal.SIGTERM)
        cluster.wait(
            lambda: _lease_holder(cluster, namespace) not in ("", holder),
            15,
            what="the standby to take the Lease",
        )
        print(f"takeover after a clean stop: {time.monotonic() - stopped:.1f} s")
        cluster.apply(tiny_gpu_job("ha-b"), namespace)
        wait_pods(cluster, namespace, "ha-b", 2, timeout=60)
        assert {p["metadata"]["uid"] for p in pods(cluster, namespace, "ha-a")} == uids
        assert status(cluster, namespace, "ha-a").get("restarts", 0) == 0

        # A killed leader cannot hand back: the other waits for the lease to expire (15 s).
        leader.start()  # comes back as a standby
        standby.kill(signal.SIGKILL)
        cluster.apply(tiny_gpu_job("ha-c"), namespace)
        wait_pods(cluster, namespace, "ha-c", 2, timeout=60)
        for op in (first, second):
            assert "Traceback" not in op.logs()
    finally:
        first.stop()
        second.stop()


def test_operator_restarts_at_1024_nodes_restart_no_job(
    cluster_factory: Any, tmp_path_factory: Any
) -> None:
    """5 operator restarts (SIGKILL, then start) while 20 two-pod jobs run on 1,024 nodes:
    no job restarts and no pod is deleted. At 64 nodes the node watch won the race anyway, so
    the old bug only showed at this size."""
    # 1,024 kwok nodes take minutes to register on 2 busy cores.
    big: Cluster = cluster_factory(
        nodes=1024, gpus_per_node=8, kueue=False, extra_args=("--timeout", "900")
    )
    ns = "restarts"
    big.kubectl("create", "namespace", ns)
    big.wait(
        lambda: (
            big.kubectl(
                "get", "serviceaccount", "default", "-n", ns, "-o", "json", check=False
            ).returncode
            == 0
        ),
        30,
        what="the default ServiceAccount",
    )
    install_crd(big)
    op = Op(big, tmp_path_factory.mktemp("restarts"))
    op.start()
    names = [f"job-{i:02d}" for i in range(20)]
    try:
        for name in names:
            big.apply(tiny_gpu_job(name, nodes=2), ns)
        for name in names:
            wait_phase(big, ns, name, "Running", timeout=180)
        uids = {p["metadata"]["uid"] for name in names for p in pods(big, ns, name)}
        assert len(uids) == 40
        for _ in range(5):
            op.kill(signal.SIGKILL)
            op.start()
            # Every job reconciled by the new process, with whatever its caches held then (the
            # old bug: a node cache not yet filled read as 1,024 lost nodes), then a little more.
            big.wait(
                lambda: _reconciles(op) >= len(names),
                120,
                1.0,
                "every job reconciled after the restart",
            )
            time.sleep(3)
        after = {p["metadata"]["uid"] for name in names for p in pods(big, ns, name)}
        deleting = [
            p["metadata"]["name"]
            for name in names
            for p in pods(big, ns, name)
            if p["metadata"].get("deletionTimestamp")
        ]
        restarts = {n: status(big, ns, n).get("restarts", 0) for n in names}
        assert after == uids and not deleting, "pods were deleted across operator restarts"
        assert set(restarts.values()) == {0}, restarts
        assert "NodeLost" not in op.logs()
        assert "Traceback" not in op.logs()
    finally:
        op.stop()
        big.down()
