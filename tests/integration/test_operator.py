"""The operator against a real apiserver, scheduler and kwok nodes (issue 6 acceptance 1–7, 10).

The operator runs as a process (`mjob operator`); kwok plays kubelet; faults come from the
cluster driver (kwok chaos stages, the Eviction API).
"""

from __future__ import annotations

import json
import time
from typing import Any

from megatron_operator.core.defaults import DEFAULT_TRAINER_IMAGE

from .conftest import Cluster
from .operator_support import (
    Op,
    condition,
    events,
    example,
    job,
    operator,  # noqa: F401 - fixture
    pods,
    status,
    tiny_gpu_job,
    wait_phase,
    wait_pods,
)


def _nodes_of(items: list[dict[str, Any]]) -> list[str]:
    return [p["spec"]["nodeName"] for p in items]


def test_cpu_and_llama70b_examples_run(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    cpu = example("cpu-tiny")
    big = example("llama3-70b")
    spec = big["spec"]
    spec["resources"]["nodes"] = 4  # a rack holds 4 kwok nodes
    spec["resources"]["gpuMemoryGiB"] = 141  # DP4 shards the optimizer less: H200s
    spec["resources"]["requests"] = {"cpu": "8", "memory": "64Gi"}
    spec["resources"].pop("network")  # kwok nodes have no rdma/ib
    spec["data"].pop("volume")  # no dataset claim here (kwok runs no trainer to read it)
    spec["topology"]["key"] = cluster.rack_key
    spec["checkpoint"]["volume"]["create"]["storageClassName"] = cluster.default_storage_class
    spec["checkpoint"]["volume"]["create"]["size"] = "1Gi"
    cluster.apply(cpu, ns)
    cluster.apply(big, ns)

    tiny_pods = wait_pods(cluster, ns, "cpu-tiny", 1, phase="Running")
    assert "nvidia.com/gpu" not in tiny_pods[0]["spec"]["containers"][0]["resources"].get(
        "limits", {}
    )
    big_pods = wait_pods(cluster, ns, "llama3-70b", 4, phase="Running", timeout=90)
    nodes = _nodes_of(big_pods)
    assert len(set(nodes)) == 4  # one pod per node
    racks = {rack for rack, members in cluster.racks.items() if set(nodes) & set(members)}
    assert len(racks) == 1, f"pods spread over racks {racks}"
    for p in big_pods:
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"

    for name in ("cpu-tiny", "llama3-70b"):
        svc = cluster.kubectl_json("get", "service", "-n", ns, name)
        assert svc["spec"]["clusterIP"] == "None"
        pvc = cluster.kubectl_json("get", "pvc", "-n", ns, f"{name}-checkpoints")
        cluster.wait(
            lambda n=name: (
                cluster.kubectl_json("get", "pvc", "-n", ns, f"{n}-checkpoints")["status"].get(
                    "phase"
                )
                == "Bound"
            ),
            30,
            what=f"{name} PVC bound",
        )
        # retained by default (docs/security.md): no ownerReference, the job's labels
        assert "ownerReferences" not in pvc["metadata"]
        assert pvc["metadata"]["labels"]["megatron.dev/job-name"] == name

    st = wait_phase(cluster, ns, "llama3-70b", "Running")
    assert st["layout"] == "TP8·PP2·VPP5·DP2"
    assert st["gpus"] == 32
    wait_phase(cluster, ns, "cpu-tiny", "Running")
    table = cluster.kubectl("get", "mj", "-n", ns).stdout
    header = table.splitlines()[0].split()
    assert header == [
        "NAME",
        "PHASE",
        "LAYOUT",
        "GPUS",
        "RESTARTS",
        "PROGRESS",
        "GOODPUT",
        "ETA",
        "QUEUE",
        "AGE",
    ]
    row = next(line.split() for line in table.splitlines() if line.startswith("llama3-70b"))
    assert row[1:5] == ["Running", "TP8·PP2·VPP5·DP2", "32", "0"]


def test_unschedulable_pods_are_explained(cluster: Cluster, namespace: str, operator: Op) -> None:
    cluster.apply(
        tiny_gpu_job("toobig", nodes=1, resources={"requests": {"cpu": "500"}}), namespace
    )

    def explained() -> dict[str, Any] | None:
        # (first the PVC may still be binding; then the scheduler names the real shortage)
        cond = condition(status(cluster, namespace, "toobig"), "PodsScheduled")
        ok = cond and cond["status"] == "False" and "Insufficient cpu" in cond["message"]
        return cond if ok else None

    cond = cluster.wait(explained, 60, what="PodsScheduled=False naming the shortage")
    assert cond["reason"] == "Unschedulable"
    assert status(cluster, namespace, "toobig")["phase"] == "Pending"


def test_one_failure_restarts_the_whole_gang(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    policy = {"backoffSeconds": 4, "maxBackoffSeconds": 60}
    cluster.apply(tiny_gpu_job("gang", nodes=3, restartPolicy=policy), ns)
    first = wait_pods(cluster, ns, "gang", 3, phase="Running", attempt=0)
    uids = {p["metadata"]["uid"] for p in first}
    wait_phase(cluster, ns, "gang", "Running")
    failed_at = time.monotonic()
    cluster.fail_pod(ns, "gang-a0-1", exit_code=1, wait=False)
    st = wait_phase(cluster, ns, "gang", "Restarting", timeout=30)
    restarting = condition(st, "Restarting")
    assert restarting is not None and restarting["status"] == "True"
    assert restarting["reason"] == "Error"
    assert (st["restarts"], st["restartsCounted"], st["restartAttempt"]) == (1, 1, 1)
    second = wait_pods(cluster, ns, "gang", 3, attempt=1, timeout=60)
    assert time.monotonic() - failed_at >= 4  # the backoff (after the old pods were gone)
    assert not uids & {p["metadata"]["uid"] for p in second}  # every pod replaced
    # each attempt's pods are new objects with new names, and the same hostnames
    assert sorted(p["metadata"]["name"] for p in second) == ["gang-a1-0", "gang-a1-1", "gang-a1-2"]
    assert sorted(p["spec"]["hostname"] for p in second) == ["gang-0", "gang-1", "gang-2"]
    wait_pods(cluster, ns, "gang", 3, phase="Running", attempt=1, timeout=60)
    st = wait_phase(cluster, ns, "gang", "Running")
    assert st["lastFailure"]["pod"] == "gang-a0-1"
    assert st["lastFailure"]["exitCode"] == 1
    assert condition(st, "Restarting")["status"] == "False"  # type: ignore[index]
    warnings = [e for e in events(cluster, ns, "gang") if e["type"] == "Warning"]
    assert any(e["reason"] == "Restarting" and "gang-a0-1" in e["message"] for e in warnings)
    # The evidence: one event for the attempt naming the failed pod, and that pod kept, Failed
    # (holding nothing), after the restart; the other pods of attempt 0 are gone.
    reports = [e for e in warnings if e["reason"] == "AttemptFailed"]
    assert len(reports) == 1 and reports[0]["message"].startswith("attempt 0: 1 pod(s) failed")
    assert "gang-a0-1" in reports[0]["message"] and "exited 1" in reports[0]["message"]
    assert st["keptPods"] == ["gang-a0-1"]
    left = {p["metadata"]["name"]: p for p in pods(cluster, ns, "gang")}
    assert set(left) == {"gang-a0-1", "gang-a1-0", "gang-a1-1", "gang-a1-2"}
    assert left["gang-a0-1"]["status"]["phase"] == "Failed"
    metrics = operator.metrics()
    assert 'megatronjob_restarts_total{name="gang",namespace="' in metrics
    # Every reason's counter exists from the job's first sight (at 0 for the unused ones).
    assert (
        'megatronjob_restarts_total{name="gang",namespace="'
        + ns
        + '",reason="Hang",rung="InPlace"} 0.0'
        in metrics
    )


def test_past_max_restarts_fails_and_frees_gpus(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("flaky", nodes=2, restartPolicy={"maxRestarts": 1}), ns)
    for attempt in (0, 1):
        wait_pods(cluster, ns, "flaky", 2, phase="Running", attempt=attempt, timeout=60)
        cluster.fail_pod(ns, f"flaky-a{attempt}-0", exit_code=3, wait=False)
    st = wait_phase(cluster, ns, "flaky", "Failed")
    assert condition(st, "Failed")["reason"] == "MaxRestartsExceeded"  # type: ignore[index]
    # What held GPUs is gone; the last attempt's failed pod stays as evidence (keepFailedPods 1),
    # Failed, so it holds nothing. Attempt 0's is gone: only the last attempt's is kept.
    cluster.wait(
        lambda: _left(cluster, ns, "flaky") == {"flaky-a1-0": "Failed"},
        60,
        what="the kept pod only",
    )
    assert st["restarts"] == 1
    assert status(cluster, ns, "flaky")["keptPods"] == ["flaky-a1-0"]


def test_fail_rule_fails_at_once(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    rules = [{"action": "Fail", "exitCodes": [42]}]
    cluster.apply(tiny_gpu_job("strict", nodes=2, restartPolicy={"rules": rules}), ns)
    wait_pods(cluster, ns, "strict", 2, phase="Running")
    cluster.fail_pod(ns, "strict-a0-1", exit_code=42, wait=False)
    st = wait_phase(cluster, ns, "strict", "Failed")
    assert st["restarts"] == 0
    assert st["lastFailure"]["exitCode"] == 42
    assert "rules[0]" in condition(st, "Failed")["message"]  # type: ignore[index]
    cluster.wait(
        lambda: _left(cluster, ns, "strict") == {"strict-a0-1": "Failed"},
        60,
        what="every pod deleted but the failed one, kept",
    )


def _left(cluster: Cluster, ns: str, job: str) -> dict[str, str]:
    """The job's pods still there, by name, with their phase."""
    return {p["metadata"]["name"]: p["status"].get("phase", "") for p in pods(cluster, ns, job)}


def test_config_error_exit_code_fails_without_retry(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("badcfg", nodes=1), ns)
    wait_pods(cluster, ns, "badcfg", 1, phase="Running")
    cluster.fail_pod(ns, "badcfg-a0-0", exit_code=78, wait=False)
    st = wait_phase(cluster, ns, "badcfg", "Failed")
    assert st["restarts"] == 0


def test_eviction_restarts_without_counting(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("evicted", nodes=2), ns)
    wait_pods(cluster, ns, "evicted", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "evicted", "Running")
    cluster.evict_pod(ns, "evicted-a0-0")
    wait_pods(cluster, ns, "evicted", 2, phase="Running", attempt=1, timeout=60)
    st = status(cluster, ns, "evicted")
    assert (st["restarts"], st["restartsCounted"]) == (1, 0)
    assert st["lastFailure"]["reason"] in ("DisruptionTarget", "PodDeleted")
    assert st["lastFailure"]["reason"] == "DisruptionTarget", st["lastFailure"]


def test_node_failure_restarts_without_counting(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("nodeloss", nodes=2), ns)
    running = wait_pods(cluster, ns, "nodeloss", 2, phase="Running", attempt=0)
    wait_phase(cluster, ns, "nodeloss", "Running")
    victim = running[0]["spec"]["nodeName"]
    cluster.fail_node(victim)
    try:
        again = wait_pods(cluster, ns, "nodeloss", 2, phase="Running", attempt=1, timeout=90)
        assert victim not in _nodes_of(again)
        st = status(cluster, ns, "nodeloss")
        assert (st["restarts"], st["restartsCounted"]) == (1, 0)
        assert st["lastFailure"]["reason"] == "NodeLost"
        assert st["lastFailure"]["node"] == victim
    finally:
        cluster.recover_node(victim)


def test_suspend_resume_and_delete(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("pausable", nodes=2), ns)
    wait_pods(cluster, ns, "pausable", 2, phase="Running", attempt=0)
    cluster.kubectl(
        "patch", "mj", "-n", ns, "pausable", "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    wait_phase(cluster, ns, "pausable", "Suspended")
    cluster.wait(lambda: pods(cluster, ns, "pausable") == [], 60, what="pods gone while suspended")
    cluster.kubectl(
        "patch", "mj", "-n", ns, "pausable", "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_pods(cluster, ns, "pausable", 2, phase="Running", attempt=1, timeout=60)
    st = wait_phase(cluster, ns, "pausable", "Running")
    assert st["restarts"] == 0

    children = {
        "serviceaccount": "pausable-trainer",
        "role": "pausable-trainer",
        "rolebinding": "pausable-trainer",
        "configmap": "pausable-config",
        "service": "pausable",
    }
    for kind, name in children.items():
        cluster.kubectl("get", kind, "-n", ns, name)
    cluster.kubectl("delete", "mj", "-n", ns, "pausable", "--wait=false")

    def all_gone() -> bool:
        left = [
            kind
            for kind, name in children.items()
            if cluster.kubectl("get", kind, "-n", ns, name, check=False).returncode == 0
        ]
        return not left and not pods(cluster, ns, "pausable")

    # The operator's own cleanup: well inside the GC's 30 s discovery of a new CRD kind.
    cluster.wait(all_gone, 20, what="every child of the deleted job gone")
    cluster.wait(
        lambda: cluster.kubectl("get", "mj", "-n", ns, "pausable", check=False).returncode != 0,
        30,
        what="the job itself gone",
    )


def test_success_when_every_pod_exits_zero(cluster: Cluster, namespace: str, operator: Op) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("done", nodes=2, ttlSecondsAfterFinished=3), ns)
    wait_pods(cluster, ns, "done", 2, phase="Running")
    cluster.complete_pod(ns, "done-a0-0")
    time.sleep(1)
    assert status(cluster, ns, "done")["phase"] in ("Running", "Pending")  # one rank is not all
    cluster.complete_pod(ns, "done-a0-1")
    st = wait_phase(cluster, ns, "done", "Succeeded")
    assert condition(st, "Succeeded")["status"] == "True"  # type: ignore[index]
    cluster.wait(
        lambda: cluster.kubectl("get", "mj", "-n", ns, "done", check=False).returncode != 0,
        30,
        what="ttlSecondsAfterFinished deleting the job",
    )


def test_invalid_spec_slipping_past_the_crd_fails_cleanly(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    # A layout the CRD's CEL cannot see: it only fails the planner's memory budget.
    doc = tiny_gpu_job("toofat", nodes=1, model={"recipe": "llama3-70b"})
    doc["spec"]["training"]["globalBatchSize"] = 8
    cluster.apply(doc, namespace)
    st = wait_phase(cluster, namespace, "toofat", "Failed")
    cond = condition(st, "Failed")
    assert cond is not None and cond["reason"] == "InvalidSpec"
    assert "spec.resources.gpuMemoryGiB" in cond["message"]
    assert pods(cluster, namespace, "toofat") == []


def test_job_body_keeps_no_kopf_state_in_status(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    cluster.apply(tiny_gpu_job("clean", nodes=1), namespace)
    wait_phase(cluster, namespace, "clean", "Running", timeout=60)
    body = job(cluster, namespace, "clean")
    assert "kopf" not in body.get("status", {})
    # no finalizer: deleting the job never waits for the operator (docs/security.md)
    assert not body["metadata"].get("finalizers")


def test_a_request_above_its_limit_is_refused_at_admission(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    # The apiserver's pod validation refuses a request above its limit; the CRD refuses such a
    # job first, by name, so no pod is ever tried. (A pod the apiserver refuses for a reason the
    # CRD cannot see is test_operator_open_pods.py's CreateFailure case.)
    doc = tiny_gpu_job(
        "badlabel", nodes=1, resources={"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}
    )
    proc = cluster.kubectl(
        "apply", f"--namespace={namespace}", "-f", "-", input=json.dumps(doc), check=False
    )
    assert proc.returncode != 0
    assert "spec.resources.requests" in proc.stderr and "above its limit" in proc.stderr
    assert pods(cluster, namespace, "badlabel") == []


def test_namespace_defaults_apply_in_scope_only(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    """A MegatronJobDefaults reaches the jobs of its namespace (image, env, pod conventions, the
    trainer ServiceAccount's annotations, an OpenShift-style identity), recorded in their
    status, and no job elsewhere."""
    ns, other = namespace, f"{namespace[:50]}-out"
    cluster.kubectl("create", "namespace", other)
    try:
        defaults = {
            "apiVersion": "megatron.dev/v1alpha1",
            "kind": "MegatronJobDefaults",
            "metadata": {"name": "platform"},
            "spec": {
                "image": "registry.example/ml/trainer:7",
                "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
                "template": {"metadata": {"annotations": {"example.com/team": "a"}}},
                "serviceAccount": {
                    "annotations": {"iam.gke.io/gcp-service-account": "t@p.iam.gserviceaccount.com"}
                },
                "podSecurityContext": {},
            },
        }
        cluster.apply(defaults, ns)
        for where in (ns, other):
            doc = tiny_gpu_job("scoped", nodes=1)
            del doc["spec"]["image"]
            cluster.apply(doc, where)
        inside = wait_pods(cluster, ns, "scoped", 1)[0]
        outside = wait_pods(cluster, other, "scoped", 1)[0]
        c_in, c_out = inside["spec"]["containers"][0], outside["spec"]["containers"][0]
        assert c_in["image"] == "registry.example/ml/trainer:7"
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in c_in["env"]
        assert inside["metadata"]["annotations"]["example.com/team"] == "a"
        assert "runAsUser" not in inside["spec"]["securityContext"]
        account = cluster.kubectl_json("get", "serviceaccount", "scoped-trainer", "-n", ns)
        assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].startswith("t@")
        assert status(cluster, ns, "scoped")["defaults"]["sources"] == [f"{ns}/platform"]
        # Outside its namespace: nothing of it.
        assert c_out["image"] == DEFAULT_TRAINER_IMAGE
        assert "NCCL_DEBUG" not in {e["name"] for e in c_out["env"]}
        assert "example.com/team" not in outside["metadata"].get("annotations", {})
        assert outside["spec"]["securityContext"]["runAsUser"] == 1000
        assert status(cluster, other, "scoped")["defaults"] == {"sources": []}
        # A refused defaults object: the CRD applies the job's own rules to it.
        bad = json.loads(json.dumps(defaults))
        bad["metadata"]["name"] = "bad"
        bad["spec"]["env"] = [{"name": "WORLD_SIZE", "value": "1"}]
        proc = cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(bad), check=False)
        assert proc.returncode != 0 and "set by the operator" in proc.stderr, proc.stderr
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_active_deadline_fails_the_job_and_stops_its_pods(
    cluster: Cluster, namespace: str, operator: Op
) -> None:
    ns = namespace
    cluster.apply(tiny_gpu_job("deadline", nodes=2, activeDeadlineSeconds=15), ns)
    wait_pods(cluster, ns, "deadline", 2, phase="Running")
    st = wait_phase(cluster, ns, "deadline", "Failed", timeout=90)
    failed = condition(st, "Failed")
    assert failed is not None and failed["reason"] == "DeadlineExceeded", st
    assert "activeDeadlineSeconds (15 s)" in failed["message"]
    cluster.wait(lambda: not pods(cluster, ns, "deadline"), 60, what="the pods stopped")
    assert "DeadlineExceeded" in {e["reason"] for e in events(cluster, ns, "deadline")}
