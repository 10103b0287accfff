"""The Helm chart on the real apiserver: its renders pass server-side dry-run, it installs,
upgrades and uninstalls leaving only the CRD and the jobs, its RBAC is enough for the operator (run
as a process with the chart's ServiceAccount token: this cluster's kwok nodes cannot run the
operator image), a running job keeps its pods across an upgrade, the admission policy refuses
what it should, and the operator exports every metric the dashboard and the alerts query."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_chart_monitoring import (
    HISTOGRAM_SUFFIXES,
    alert_rules,
    dashboard_exprs,
    metric_names,
)

from .conftest import REPO, Cluster
from .operator_support import Op, install_crd, pods, status, tiny_gpu_job, wait_phase, wait_pods

CHART = str(REPO / "charts" / "megatron-operator")
CRD = "megatronjobs.megatron.dev"
DEFAULTS_CRD = "megatronjobdefaults.megatron.dev"
# Not installable here: the Prometheus Operator's CRDs are not part of this cluster.
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
EVERYTHING = [
    "replicas=2",
    "podDisruptionBudget.enabled=true",
    "kueue.enabled=true",
    "dashboard.enabled=true",
    "admissionPolicy.enabled=true",
    "admissionPolicy.allowedPriorityClasses={train-high}",
    "admissionPolicy.images.allowed={registry.example/*}",
    "admissionPolicy.images.requirePullPolicyAlways=true",
    "admissionPolicy.maxNodes=4",
    "admissionPolicy.maxGracePeriodSeconds=600",
]


@pytest.fixture
def jobs_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"chart-jobs-{int(time.time() * 1000) % 10**8}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def template(cluster: Cluster, namespace: str, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "mo", CHART, "-n", namespace]
    for item in sets:
        args += ["--set", item]
    return [o for o in yaml.safe_load_all(cluster.helm(*args).stdout) if o]


def adopt_crd(cluster: Cluster, release: str, namespace: str) -> None:
    """Let the release take over the CRDs other tests applied with kubectl (docs/install.md)."""
    for crd in (CRD, DEFAULTS_CRD):
        if cluster.kubectl("get", "crd", crd, check=False).returncode != 0:
            continue
        cluster.kubectl("label", "crd", crd, "--overwrite", "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl(
            "annotate",
            "crd",
            crd,
            "--overwrite",
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
        )


def ours(cluster: Cluster, release: str, namespaces: list[str]) -> list[str]:
    """Every object the release labelled, cluster-scoped and in the given namespaces."""
    selector = f"app.kubernetes.io/instance={release}"
    found = []
    for kinds, ns in [
        (
            "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
            None,
        ),
        *(
            (
                "deployments,services,serviceaccounts,configmaps,roles,rolebindings,"
                "poddisruptionbudgets",
                n,
            )
            for n in namespaces
        ),
    ]:
        args = ["get", kinds, "-l", selector, "-o", "name"]
        args += ["-n", ns] if ns else []
        found += cluster.kubectl(*args).stdout.split()
    return found


def sa_cluster(cluster: Cluster, namespace: str, sa: str, tmp: Path) -> Cluster:
    """The same cluster, seen with a ServiceAccount's token instead of the admin certificate."""
    token = cluster.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = tmp / f"{sa}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return dataclasses.replace(cluster, info={**cluster.info, "kubeconfig": str(path)}, owned=False)


def allowed(cluster: Cluster, user: str, verb: str, group: str, resource: str, ns: str) -> bool:
    """A SubjectAccessReview: unlike `kubectl auth can-i`, it needs no discovery of the resource
    (Kueue's CRDs may not be installed on this cluster)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "verb": verb,
                "namespace": ns,
            },
        },
    }
    out = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review)).stdout
    return bool(json.loads(out)["status"].get("allowed"))


def metrics_reader_token(cluster: Cluster, namespace: str, role: str) -> str:
    """A token of a ServiceAccount bound to the chart's metrics-reader ClusterRole (what a
    Prometheus would be given)."""
    cluster.kubectl("create", "serviceaccount", "prom", "-n", namespace)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        f"prom-{namespace}",
        f"--clusterrole={role}",
        f"--serviceaccount={namespace}:prom",
    )
    return str(cluster.kubectl("create", "token", "prom", "-n", namespace).stdout.strip())


def metrics_status(op: Op, token: str | None) -> int:
    import urllib.error

    try:
        op.metrics(token)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    return 200


def exported(text: str) -> set[str]:
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M):
        names.add(name)
        if kind == "histogram":
            names.update(name + s for s in HISTOGRAM_SUFFIXES)
    names.update(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, flags=re.M))
    return names


def test_chart_renders_pass_server_side_dry_run(
    cluster: Cluster, namespace: str, jobs_namespace: str
) -> None:
    cluster.helm("lint", CHART, "--strict", "--set", f"watchNamespaces={{{jobs_namespace}}}")
    renders = {
        "defaults": [f"watchNamespaces={{{jobs_namespace}}}"],
        "cluster-wide": ["clusterWide=true"],
        "everything": [*EVERYTHING, f"watchNamespaces={{{jobs_namespace}}}"],
    }
    for name, sets in renders.items():
        objs = [o for o in template(cluster, namespace, *sets) if o["kind"] not in MONITORING]
        text = yaml.safe_dump_all(objs)
        proc = cluster.kubectl(
            "apply",
            "--dry-run=server",
            "--server-side",
            "--force-conflicts",
            "-f",
            "-",
            input=text,
            check=False,
        )
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        assert len(proc.stdout.strip().splitlines()) == len(objs), f"{name}: {proc.stdout}"


def test_admission_policy_on_the_apiserver(cluster: Cluster, namespace: str) -> None:
    install_crd(cluster)
    release = "vap"
    cluster.helm(
        "install",
        release,
        CHART,
        "-n",
        namespace,
        "--wait=false",
        "--set",
        "crds.install=false",
        "--set",
        "clusterWide=true",
        *(a for s in EVERYTHING if s.startswith("admissionPolicy") for a in ("--set", s)),
    )
    policy = f"{release}-megatron-operator-limits"
    try:
        good = tiny_gpu_job("ok", nodes=2, image="registry.example/ml/trainer:1@sha256:" + "a" * 64)
        good["spec"]["priorityClassName"] = "train-high"
        good["spec"]["imagePullPolicy"] = "Always"
        good["spec"]["resources"]["nodeSelector"] = {"nvidia.com/gpu.product": "H100"}
        good["spec"]["resources"]["tolerations"] = [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        ]

        def attempt(doc: dict[str, Any]) -> str:
            proc = cluster.kubectl(
                "create",
                "--dry-run=server",
                "-n",
                namespace,
                "-f",
                "-",
                input=yaml.safe_dump(doc),
                check=False,
            )
            return "" if proc.returncode == 0 else proc.stderr

        def bad(**change: Any) -> dict[str, Any]:
            doc: dict[str, Any] = yaml.safe_load(yaml.safe_dump(good))
            for path, value in change.items():
                *parents, leaf = path.split("__")
                node = doc["spec"]
                for p in parents:
                    node = node.setdefault(p, {})
                node[leaf] = value
            return doc

        cases = {
            "image": (bad(image="docker.io/evil:1"), "is not allowed here"),
            # A prefix string would have let these through: registry/repository is matched.
            "image host prefix": (bad(image="registry.example.evil.io/x:1"), "is not allowed"),
            "image path prefix": (bad(image="registry.example-evil/ml:1"), "is not allowed"),
            "image without registry": (bad(image="trainer:1"), "docker.io/library/trainer"),
            # An uppercase first component is a registry host to the runtime, not a Hub path.
            "image with an uppercase host": (
                bad(image="Evilhost/trainer:1"),
                "(repository Evilhost/trainer)",
            ),
            "a system priority": (
                bad(priorityClassName="system-cluster-critical"),
                "is for the cluster's own components",
            ),
            "pull policy": (bad(imagePullPolicy="IfNotPresent"), "must be Always"),
            "node selector": (
                bad(resources__nodeSelector={"node-role.kubernetes.io/control-plane": ""}),
                "only these node label keys",
            ),
            "toleration effect": (
                bad(
                    resources__tolerations=[
                        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}
                    ]
                ),
                "allowedTolerations",
            ),
            "nodes": (bad(resources__nodes=8, training__globalBatchSize=128), "node cap of 4"),
            "priority": (bad(priorityClassName="batch-urgent"), "not allowed here"),
            "grace": (bad(checkpoint__gracePeriodSeconds=1200), "limit of 600"),
            "control-plane": (
                bad(
                    resources__tolerations=[
                        {
                            "key": "node-role.kubernetes.io/control-plane",
                            "operator": "Exists",
                            "effect": "NoSchedule",
                        }
                    ]
                ),
                "spec.resources.tolerations",
            ),
            "any-taint": (bad(resources__tolerations=[{"operator": "Exists"}]), "without a key"),
            "image with a port registry": (
                bad(image="registry.example:5000/ml/trainer:1"),
                "registry.example:5000/ml/trainer",
            ),
        }
        # The apiserver loads a new policy within a second or two: wait for the first refusal.
        deadline = time.monotonic() + 30
        while not attempt(cases["image"][0]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert attempt(good) == ""
        for name, (doc, message) in cases.items():
            err = attempt(doc)
            assert policy in err and message in err, f"{name}: {err!r}"
        assert attempt(bad(image="registry.example/ml/other")) == ""  # any tag, any depth
        # The CEL type-checks against the CRD's schema without a warning.
        vap = cluster.kubectl_json("get", "validatingadmissionpolicy", policy)
        assert not (vap.get("status", {}).get("typeChecking") or {}).get("expressionWarnings")
    finally:
        cluster.helm("uninstall", release, "-n", namespace)
    assert cluster.kubectl("get", "validatingadmissionpolicy", policy, check=False).returncode != 0


def test_install_upgrade_uninstall_with_a_running_job(
    cluster: Cluster, namespace: str, jobs_namespace: str, tmp_path: Path
) -> None:
    install_crd(cluster)
    adopt_crd(cluster, "mo", namespace)
    base = ["--set", f"watchNamespaces={{{jobs_namespace}}}", "--wait=false"]
    cluster.helm("install", "mo", CHART, "-n", namespace, *base)
    op: Op | None = None
    try:
        crd = cluster.kubectl_json("get", "crd", CRD)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "mo"
        sa = "mo-megatron-operator"
        # The operator pod passes admission (its restricted securityContext):
        # the ReplicaSet creates it, and kwok "runs" it.
        cluster.wait(
            lambda: cluster.kubectl_json(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=mo"
            )["items"],
            timeout=60,
            what="the operator Deployment's pod",
        )
        pod = cluster.kubectl_json(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=mo"
        )["items"][0]
        # No PriorityClass by default (GKE refuses system-cluster-critical outside kube-system).
        assert "priorityClassName" not in pod["spec"]
        who = f"--as=system:serviceaccount:{namespace}:{sa}"

        def can(*args: str) -> str:
            return cluster.kubectl("auth", "can-i", *args, who, check=False).stdout.strip()

        # Namespaced mode: rights in the watched namespace, reads of nodes, nothing elsewhere.
        assert can("create", "pods", "-n", jobs_namespace) == "yes"
        assert can("update", "megatronjobs", "--subresource=status", "-n", jobs_namespace) == "yes"
        assert can("update", "megatronjobs", "-n", jobs_namespace) == "no"  # kopf patches
        assert can("create", "networkpolicies", "-n", jobs_namespace) == "yes"
        assert can("create", "pods", "-n", "kube-system") == "no"
        assert can("list", "megatronjobs", "-n", "default") == "no"
        # Secrets: the jobs' coordinator keys, created and read back for the ownership check,
        # never updated (creating pods there could mount any Secret anyway).
        assert can("create", "secrets", "-n", jobs_namespace) == "yes"
        assert can("update", "secrets", "-n", jobs_namespace) == "no"
        assert can("get", "secrets", "-n", "default") == "no"
        assert can("watch", "nodes") == "yes"
        assert can("delete", "nodes") == "no"
        user = f"system:serviceaccount:{namespace}:{sa}"
        assert not allowed(cluster, user, "create", "kueue.x-k8s.io", "workloads", jobs_namespace)
        assert can("update", "leases", "-n", namespace) == "yes"  # leader election
        assert can("delete", "leases", "-n", jobs_namespace) == "no"  # the GC's job

        # The operator, with exactly the chart's rights.
        op = Op(
            sa_cluster(cluster, namespace, sa, tmp_path),
            tmp_path,
            f"--namespace={jobs_namespace}",
            "--kueue=off",  # as the chart's Deployment passes it with kueue.enabled=false
            "--metrics-auth=kubernetes",  # as the chart's secure metrics (here on loopback)
        )
        op.start()
        cluster.apply(tiny_gpu_job("keep-me", nodes=2), jobs_namespace)
        wait_pods(cluster, jobs_namespace, "keep-me", 2, phase="Running")
        wait_phase(cluster, jobs_namespace, "keep-me", "Running")
        before = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in pods(cluster, jobs_namespace, "keep-me")
        }

        # /metrics: only for a token allowed to get it (TokenReview + SubjectAccessReview).
        reader = metrics_reader_token(cluster, namespace, "mo-megatron-operator-metrics-reader")
        stranger = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
        assert metrics_status(op, None) == 401
        assert metrics_status(op, "not-a-token") == 401
        assert metrics_status(op, stranger) == 403
        assert metrics_status(op, reader) == 200

        # The running operator exports every metric the dashboard and the alerts query.
        queried = set()
        for expr in [*dashboard_exprs(), *(r["expr"] for r in alert_rules())]:
            queried |= metric_names(expr)
        missing = queried - exported(op.metrics(reader))
        assert not missing, f"queried but not exported: {sorted(missing)}"

        # The guardrails: the operator's identity writes only what is labelled as ours, and a
        # trainer's only its progress record (ValidatingAdmissionPolicies, on by default).
        as_operator = f"--as=system:serviceaccount:{namespace}:{sa}"
        unlabelled = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
        labelled = {
            **unlabelled,
            "metadata": {
                "name": "x",
                "labels": {"app.kubernetes.io/managed-by": "megatron-operator"},
            },
        }
        for doc, ok in ((unlabelled, False), (labelled, True)):
            proc = cluster.kubectl(
                "create", "--dry-run=server", "-n", jobs_namespace, as_operator, "-f", "-",
                input=json.dumps(doc), check=False,
            )  # fmt: skip
            assert (proc.returncode == 0) == ok, proc.stderr
            assert ok or "operator-writes" in proc.stderr
        as_trainer = f"--as=system:serviceaccount:{jobs_namespace}:keep-me-trainer"
        lease = ["patch", "lease", "keep-me-progress", "-n", jobs_namespace, as_trainer]
        proc = cluster.kubectl(
            *lease, "--type=merge", "-p", '{"metadata":{"finalizers":["example.com/block"]}}',
            check=False,
        )  # fmt: skip
        assert proc.returncode != 0 and "may not change its progress Lease's finalizers" in (
            proc.stderr
        )
        cluster.kubectl(
            *lease,
            "--type=merge",
            "-p",
            '{"metadata":{"annotations":{"megatron.dev/progress":"{}"}}}',
        )

        # Upgrade with changed values, and roll the operator as the Deployment would.
        cluster.helm(
            "upgrade",
            "mo",
            CHART,
            "-n",
            namespace,
            *base,
            "--set",
            "workers=16",
            "--set",
            "replicas=2",
            "--set",
            "podDisruptionBudget.enabled=true",
            "--set",
            "kueue.enabled=true",
        )
        deploy = cluster.kubectl_json("get", "deployment", "-n", namespace, "mo-megatron-operator")
        assert deploy["spec"]["replicas"] == 2
        assert "--workers=16" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        cluster.kubectl("get", "pdb", "-n", namespace, "mo-megatron-operator")
        assert allowed(cluster, user, "create", "kueue.x-k8s.io", "workloads", jobs_namespace)

        # The guardrail's one exception: taking over a Workload MultiKueue made (its origin
        # label, no controller yet) when the update makes a MegatronJob its controller; never a
        # Workload MultiKueue did not make, one another object controls, or another controller.
        origin = {"kueue.x-k8s.io/multikueue-origin": "multikueue"}

        def workload(name: str, refs: list[dict[str, Any]], labels: dict[str, str]) -> Any:
            return {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "Workload",
                "metadata": {"name": name, "ownerReferences": refs, "labels": labels},
                "spec": {
                    "queueName": "q",
                    "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                        "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}],
                    }}}],
                },
            }  # fmt: skip

        cluster.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}},
                      jobs_namespace)  # fmt: skip
        uid = cluster.kubectl_json("get", "configmap", "other", "-n", jobs_namespace)
        other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "other",
                 "uid": uid["metadata"]["uid"]}  # fmt: skip
        cluster.apply(workload("mk-copy", [], origin), jobs_namespace)
        cluster.apply(workload("plain", [], {}), jobs_namespace)
        cluster.apply(workload("theirs", [{**other, "controller": True}], origin), jobs_namespace)
        managed = {"app.kubernetes.io/managed-by": "megatron-operator"}
        job = {"apiVersion": "megatron.dev/v1alpha1", "kind": "MegatronJob", "name": "job",
               "uid": "2", "controller": True}  # fmt: skip
        take = {"metadata": {"labels": managed, "ownerReferences": [job]}}
        by_a_configmap = {
            "metadata": {"labels": managed, "ownerReferences": [{**other, "controller": True}]}
        }
        for name, patch, ok in (
            ("mk-copy", {"metadata": {"labels": {"x": "y"}}}, False),  # not made ours
            ("mk-copy", by_a_configmap, False),  # not by a MegatronJob
            ("mk-copy", take, True),
            ("plain", take, False),  # MultiKueue did not make it
            ("theirs", take, False),
        ):
            proc = cluster.kubectl(
                "patch", "workloads.kueue.x-k8s.io", name, "-n", jobs_namespace, as_operator,
                "--type=merge", "-p", json.dumps(patch), "--dry-run=server", check=False,
            )  # fmt: skip
            assert (proc.returncode == 0) == ok, (name, patch, proc.stderr)
            assert ok or "operator-writes" in proc.stderr, (name, proc.stderr)
        # Its status is a write too (the PodsReady and Finished conditions): a Workload not
        # labelled ours is refused. (kubectl reads a subresource before it patches, which the
        # operator may not: the client patches it directly, as the operator does.)
        import kubernetes

        client = cluster.api_client()
        client.set_default_header("Impersonate-User", user)
        with pytest.raises(kubernetes.client.ApiException) as refused:
            kubernetes.client.CustomObjectsApi(client).patch_namespaced_custom_object_status(
                "kueue.x-k8s.io", "v1beta1", jobs_namespace, "workloads", "plain",
                {"status": {"conditions": []}}, dry_run="All",
            )  # fmt: skip
        assert refused.value.status == 403 and "operator-writes" in str(refused.value.body)
        op.stop()
        op.start()
        time.sleep(10)  # longer than --node-lost-grace-seconds=5: a misjudged node would show
        after = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in pods(cluster, jobs_namespace, "keep-me")
        }
        assert after == before
        st = status(cluster, jobs_namespace, "keep-me")
        assert st["phase"] == "Running" and st.get("restarts", 0) == 0
        assert "Traceback" not in op.logs(), op.logs()[-3000:]
        # The chart's RBAC was enough for everything the operator did.
        denied = [line for line in op.logs().splitlines() if "forbidden" in line.lower()]
        assert not denied, denied[:3]
    finally:
        if op is not None:
            op.stop()
        cluster.helm("uninstall", "mo", "-n", namespace)
        cluster.kubectl("delete", "clusterrolebinding", f"prom-{namespace}", check=False)

    # Nothing of ours is left but the CRD and the job (with its pods).
    assert ours(cluster, "mo", [namespace, jobs_namespace]) == []
    cluster.kubectl("get", "crd", CRD)
    assert status(cluster, jobs_namespace, "keep-me")["phase"] == "Running"
    assert {p["metadata"]["uid"] for p in pods(cluster, jobs_namespace, "keep-me")} == set(
        before.values()
    )
    cluster.kubectl(
        "patch",
        "mj",
        "-n",
        jobs_namespace,
        "keep-me",
        "--type=merge",
        "-p",
        '{"metadata":{"finalizers":null}}',
        check=False,
    )
    cluster.kubectl("delete", "mj", "-n", jobs_namespace, "keep-me", "--wait=false", check=False)


def test_platform_values_install_and_reach_the_jobs(
    cluster: Cluster, namespace: str, jobs_namespace: str, tmp_path: Path
) -> None:
    """The chart as OpenShift and EKS need it, installed on the apiserver: no fixed uid (the
    operator pod is admitted without one), no PriorityClass, the claim key from a Secret the
    platform keeps, IRSA on the trainer ServiceAccount. The operator, run with the chart's
    token and its --job-defaults file, gives a job in another namespace (the default watches
    them all) that ServiceAccount annotation and no fixed uid; NOTES say what it watches."""
    install_crd(cluster)
    role = "arn:aws:iam::111122223333:role/training"
    cluster.kubectl(
        "create", "secret", "generic", "kept-claim-key", "-n", namespace,
        "--from-literal=key=" + "k" * 48,
    )  # fmt: skip
    values = [
        "crds.install=false",  # the session's CRDs are kubectl-applied (install_crd)
        "podSecurityContext.runAsUser=null",
        "trainerPods.runAsUser=null",
        "trainerPods.runAsGroup=null",
        "trainerPods.fsGroup=null",
        "claimKey.existingSecret=kept-claim-key",
        f"trainerPods.serviceAccountAnnotations.eks\\.amazonaws\\.com/role-arn={role}",
    ]
    args = [a for v in values for a in ("--set", v)]
    out = cluster.helm("install", "plat", CHART, "-n", namespace, "--wait=false", *args).stdout
    op: Op | None = None
    try:
        assert "watching every namespace" in out and "kubectl create namespace team-a" in out, out
        assert "claimKey.existingSecret" not in out  # already set: no GitOps warning
        pod = cluster.wait(
            lambda: cluster.kubectl_json(
                "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=plat"
            )["items"],
            timeout=60,
            what="the operator Deployment's pod",
        )[0]
        assert "runAsUser" not in pod["spec"]["securityContext"]
        assert "priorityClassName" not in pod["spec"]
        claim = next(v for v in pod["spec"]["volumes"] if v["name"] == "claim-key")
        assert claim["secret"]["secretName"] == "kept-claim-key"
        cm = cluster.kubectl_json(
            "get", "configmap", "plat-megatron-operator-job-defaults", "-n", namespace
        )
        defaults = tmp_path / "defaults.json"
        defaults.write_text(cm["data"]["defaults.json"])
        op = Op(
            sa_cluster(cluster, namespace, "plat-megatron-operator", tmp_path),
            tmp_path,
            "--kueue=off",
            f"--job-defaults={defaults}",
        )
        op.start()
        doc = tiny_gpu_job("platform", nodes=1)
        del doc["spec"]["image"]
        cluster.apply(doc, jobs_namespace)
        (made,) = wait_pods(cluster, jobs_namespace, "platform", 1)
        assert "runAsUser" not in made["spec"]["securityContext"]
        assert "fsGroup" not in made["spec"]["securityContext"]
        account = cluster.kubectl_json(
            "get", "serviceaccount", "platform-trainer", "-n", jobs_namespace
        )
        assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
        st = status(cluster, jobs_namespace, "platform")
        assert st["defaults"]["sources"] == ["operator"]
        denied = [line for line in op.logs().splitlines() if "forbidden" in line.lower()]
        assert not denied, denied[:3]
    finally:
        if op is not None:
            op.stop()
        cluster.helm("uninstall", "plat", "-n", namespace)
