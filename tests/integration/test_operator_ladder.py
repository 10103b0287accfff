"""The restart ladder through the real operator and apiserver (kwok plays the kubelets).

kwok's pods run no launcher, so the test plays the launchers' coordinator: it writes the report
into the progress Lease's annotation, with the identity the trainer's pods have (the job's
ServiceAccount, whose Role allows exactly that), as the coordinator in the pod of node rank 0
would. Everything the operator does with it is real: the watch that wakes the job, the decision
in the status, which pods it keeps, deletes and creates.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime
from typing import Any

from megatron_contract.ladder import REPORT_ANNOTATION, RankFailure, Report

from .conftest import Cluster
from .operator_support import (
    Op,
    events,
    operator,  # noqa: F401 - fixture
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)


def in_place_job(name: str, nodes: int = 2, **policy: Any) -> dict[str, Any]:
    restart = {"strategy": "InPlace", "backoffSeconds": 1, "maxBackoffSeconds": 2, **policy}
    return tiny_gpu_job(name, nodes=nodes, restartPolicy=restart)


def report(cluster: Cluster, ns: str, job: str, attempt: int, node: int, code: int) -> None:
    """The coordinator's report of a failed rank, written as the trainer's identity would."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    text = Report(attempt, 2, 2, failures=(RankFailure(node, 3, code, now),)).dumps()
    cluster.kubectl(
        "annotate",
        "lease",
        "-n",
        ns,
        f"{job}-progress",
        f"{REPORT_ANNOTATION}={text}",
        "--overwrite",
        f"--as=system:serviceaccount:{ns}:{job}-trainer",
    )


def uids(cluster: Cluster, ns: str, job: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, ns, job)}


def wait_status(cluster: Cluster, ns: str, job: str, pred: Any, what: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        st = status(cluster, ns, job)
        return st if pred(st) else None

    result: dict[str, Any] = cluster.wait(check, 60, interval=0.2, what=what)
    return result


def test_a_reported_rank_failure_restarts_every_rank_in_place(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(in_place_job("inplace"), ns)
    wait_pods(cluster, ns, "inplace", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "inplace", "Running")
    before = uids(cluster, ns, "inplace")
    # A change allowed at any time, which the next attempt's ranks must read.
    cluster.kubectl(
        "patch", "mj", "-n", ns, "inplace", "--type=merge", "-p",
        '{"spec":{"training":{"trainIters":250}}}',
    )  # fmt: skip
    report(cluster, ns, "inplace", attempt=0, node=1, code=1)
    st = wait_status(cluster, ns, "inplace", lambda s: s.get("restartAttempt") == 1, "the decision")
    failure = st["lastFailure"]
    assert (failure["rung"], failure["pod"], failure["exitCode"]) == ("InPlace", "inplace-a0-1", 1)
    assert (st["restarts"], st["restartsCounted"], st.get("gangAttempt")) == (1, 1, 0)
    st = wait_phase(cluster, ns, "inplace", "Running")
    assert st["restartAttempt"] == 1 and st["launchedAttempt"] == 1
    time.sleep(2)
    assert uids(cluster, ns, "inplace") == before  # no pod deleted, none created
    # The release refreshed the config the ranks of the next attempt read.
    config = cluster.kubectl_json("get", "configmap", "-n", ns, "inplace-config")
    assert json.loads(config["data"]["config.json"])["training"]["trainIters"] == 250
    warnings = [e["message"] for e in events(cluster, ns, "inplace") if e["type"] == "Warning"]
    assert any("restarting every rank in place as attempt 1" in m for m in warnings), warnings
    assert 'rung="InPlace"' in operator.metrics()
    # The old report names attempt 0: it is no failure of attempt 1.
    time.sleep(2)
    assert status(cluster, ns, "inplace")["restarts"] == 1


def test_a_failed_pod_is_replaced_alone_and_node_rank_0_recreates_the_gang(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(in_place_job("ladder", nodes=3), ns)
    wait_pods(cluster, ns, "ladder", 3, phase="Running", attempt=0)
    wait_phase(cluster, ns, "ladder", "Running")
    before = uids(cluster, ns, "ladder")
    cluster.fail_pod(ns, "ladder-a0-1", exit_code=137, wait=False)  # its container was killed
    cluster.wait(
        lambda: (
            {p["metadata"]["name"] for p in pods(cluster, ns, "ladder")}
            == {"ladder-a0-0", "ladder-a1-1", "ladder-a0-2"}
        ),
        60,
        what="pod 1 replaced alone",
    )
    st = wait_phase(cluster, ns, "ladder", "Running")
    assert st["lastFailure"]["rung"] == "ReplacePod" and st["restarts"] == 1
    now = uids(cluster, ns, "ladder")
    assert (
        now["ladder-a0-0"] == before["ladder-a0-0"] and now["ladder-a0-2"] == before["ladder-a0-2"]
    )
    replaced = next(
        p for p in pods(cluster, ns, "ladder") if p["metadata"]["name"] == "ladder-a1-1"
    )
    assert replaced["spec"]["hostname"] == "ladder-1"
    # Attempt 1 never reported a step, but a pod failure of node rank 0 recreates anyway.
    cluster.fail_pod(ns, "ladder-a0-0", exit_code=137, wait=False)
    running = wait_pods(cluster, ns, "ladder", 3, phase="Running", attempt=2, timeout=60)
    assert sorted(p["metadata"]["name"] for p in running) == [
        "ladder-a2-0",
        "ladder-a2-1",
        "ladder-a2-2",
    ]
    st = wait_phase(cluster, ns, "ladder", "Running")
    assert st["lastFailure"]["rung"] == "Recreate" and st["restarts"] == 2
    assert "gangAttempt" not in st


def test_a_non_retryable_exit_code_a_rank_reports_fails_the_job_at_once(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(in_place_job("fatal"), ns)
    wait_pods(cluster, ns, "fatal", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "fatal", "Running")
    report(cluster, ns, "fatal", attempt=0, node=0, code=17)  # NaN: nothing to gain by retrying
    st = wait_phase(cluster, ns, "fatal", "Failed")
    assert st.get("restarts", 0) == 0 and st["lastFailure"]["exitCode"] == 17
    cluster.wait(lambda: pods(cluster, ns, "fatal") == [], 60, what="every pod deleted")


def restarting_events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return [e for e in events(cluster, ns, name) if e["reason"] == "Restarting"]


def test_an_operator_killed_mid_in_place_restart_makes_no_duplicate(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    # The module's one operator is the one killed: a second one watching the same cluster would
    # go on reconciling the job while the first is down, and the test would show nothing.
    op = operator
    ns = namespace
    try:
        # A long backoff holds the restart between its decision and its release (an operator
        # start under CI load took over 20 s).
        cluster.apply(in_place_job("held", backoffSeconds=60, maxBackoffSeconds=60), ns)
        wait_pods(cluster, ns, "held", 2, phase="Running", attempt=0)
        wait_phase(cluster, ns, "held", "Running")
        before = uids(cluster, ns, "held")
        report(cluster, ns, "held", attempt=0, node=1, code=1)
        decided = wait_phase(cluster, ns, "held", "Restarting")
        release = datetime.strptime(decided["restartAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        # Events are posted in the background after the status (best effort: one that a kill
        # overtakes is lost, and the status says it), so the decision's event is waited for
        # before the kill; the test is that no restarted operator posts it again.
        cluster.wait(
            lambda: restarting_events(cluster, ns, "held"), 30, what="the Restarting event"
        )
        op.kill(signal.SIGKILL)  # between the decision and the release
        time.sleep(1)
        op.start()
        time.sleep(3)
        st = status(cluster, ns, "held")
        seen = (st["phase"], st["restarts"], st["restartAttempt"], st.get("restartAt"))
        if datetime.now(UTC) < release:
            # The restarted operator kept the decision and its release time; it made no other.
            assert seen == ("Restarting", 1, 1, decided["restartAt"]), (seen, decided)
        else:  # too slow a start to see the held restart; still one restart, one attempt
            assert seen[1:3] == (1, 1), (seen, decided)
        op.kill(signal.SIGKILL)  # and once more, before its release or right after it
        op.start()
        st = wait_phase(cluster, ns, "held", "Running", timeout=120)
        op.kill(signal.SIGKILL)
        op.start()
        time.sleep(4)
        st = status(cluster, ns, "held")
        assert (st["phase"], st["restarts"], st["restartAttempt"]) == ("Running", 1, 1), st
        assert uids(cluster, ns, "held") == before
        restarting = restarting_events(cluster, ns, "held")
        assert len(restarting) == 1 and restarting[0].get("count", 1) == 1, restarting
        assert "Traceback" not in op.logs()
    finally:
        if op.proc is None or op.proc.poll() is not None:
            op.start()  # the module's later tests need it
        cluster.kubectl("delete", "mj", "-n", ns, "held", "--wait=false", check=False)


def test_the_trainer_identity_can_watch_its_job_but_not_write_its_status(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(in_place_job("rbac"), ns)
    wait_pods(cluster, ns, "rbac", 2, attempt=0)
    who = f"--as=system:serviceaccount:{ns}:rbac-trainer"
    allowed = {
        (verb, what): cluster.kubectl(
            "auth", "can-i", verb, what, "-n", ns, who, check=False
        ).stdout.strip()
        for verb, what in (
            ("watch", "megatronjobs.megatron.dev/rbac"),
            ("get", "megatronjobs.megatron.dev/rbac"),
            ("update", "megatronjobs.megatron.dev/rbac"),
            ("patch", "megatronjobs.megatron.dev/rbac"),
            ("get", "megatronjobs.megatron.dev/other"),
            ("update", "leases.coordination.k8s.io/rbac-progress"),
        )
    }
    assert allowed == {
        ("watch", "megatronjobs.megatron.dev/rbac"): "yes",
        ("get", "megatronjobs.megatron.dev/rbac"): "yes",
        ("update", "megatronjobs.megatron.dev/rbac"): "no",
        ("patch", "megatronjobs.megatron.dev/rbac"): "no",
        ("get", "megatronjobs.megatron.dev/other"): "no",
        ("update", "leases.coordination.k8s.io/rbac-progress"): "yes",
    }
    # The coordinator's exact watch: a list of one job by field selector, as that identity.
    out = cluster.kubectl(
        "get",
        "megatronjobs",
        "-n",
        ns,
        "--field-selector=metadata.name=rbac",
        "-o",
        "json",
        who,
    ).stdout
    assert [i["metadata"]["name"] for i in json.loads(out)["items"]] == ["rbac"]
