"""The chart lints strictly, its schema refuses bad values, and every render is valid Kubernetes:
with the defaults, in namespaced mode, and with every optional object on."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from megatron_operator.api import MegatronJob, load_job
from megatron_operator.core.defaults import (
    DEFAULT_LAUNCHER_IMAGE,
    DEFAULT_TRAINER_IMAGE,
    Layer,
    apply,
    platform,
    resolve,
)
from megatron_operator.core.planner import plan
from megatron_operator.core.render import render as render_job

from .chartkit import CHART, EVERYTHING, ROOT, of_kind, one, render, rules_for, run_helm
from .specs import DELETE, job_of


def read_defaults_from(defaults: dict[str, Any]) -> dict[str, Any]:
    """The chart's --job-defaults file as the operator reads it (validated, merged)."""
    record, errors = resolve([Layer("operator", defaults)])
    assert errors == [] and record is not None
    merged: dict[str, Any] = record["spec"]
    return merged


def load_job_with(job: MegatronJob, defaults: dict[str, Any]) -> MegatronJob:
    doc = {**job.model_dump(by_alias=True, exclude_none=True, mode="json")}
    doc["spec"] = apply(job.spec.to_api(), defaults)
    return load_job(doc)


def operator_role(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's own ClusterRole (not the metrics reader for Prometheus)."""
    found = [
        o for o in of_kind(objs, "ClusterRole") if o["metadata"]["name"] == "mo-megatron-operator"
    ]
    assert len(found) == 1
    return found[0]


# Prometheus Operator kinds: kubernetes-validate has no schema for them (their CRDs are not part
# of Kubernetes); tests/unit/test_chart_monitoring.py checks their content instead.
MONITORING = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

RENDERS = {
    "defaults": [],
    "namespaced": ["watchNamespaces={team-a,team-b}"],
    "everything": [*EVERYTHING, "watchNamespaces={team-a}"],
    "everything-clusterwide": EVERYTHING,
    "insecure-metrics": ["metrics.secure=false"],
}
MULTI_TENANT = str(CHART / "values-multi-tenant.yaml")


def test_lint_strict() -> None:
    ns = ("--set", "watchNamespaces={team-a}")
    run_helm("lint", str(CHART), "--strict", *ns)
    run_helm("lint", str(CHART), "--strict", *ns, *(a for s in EVERYTHING for a in ("--set", s)))


@pytest.mark.parametrize("name", list(RENDERS))
def test_render_is_valid_kubernetes(name: str) -> None:
    objs = render(*RENDERS[name])
    assert objs
    for obj in objs:
        if obj["kind"] in MONITORING:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


def test_everything_renders_every_optional_object() -> None:
    kinds = {o["kind"] for o in render(*EVERYTHING)}
    for kind in (
        "PodDisruptionBudget",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "CustomResourceDefinition",
    ):
        assert kind in kinds, kind
    defaults = render()
    assert {o["kind"] for o in defaults}.isdisjoint(MONITORING | {"PodDisruptionBudget"})
    # The one ConfigMap by default: the jobs' defaults (the dashboard's is opt-in).
    assert [c["metadata"]["name"] for c in of_kind(defaults, "ConfigMap")] == [
        "mo-megatron-operator-job-defaults"
    ]
    policies = [p["metadata"]["name"] for p in of_kind(defaults, "ValidatingAdmissionPolicy")]
    assert not [n for n in policies if n.endswith("-limits")]  # the tenant policy is opt-in


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["replicas=two"], "/replicas': got string, want integer"),
        (["metrics.port=99999"], "/metrics/port"),
        (["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (["replica=2"], "additional properties 'replica' not allowed"),
        (["alerts.enable=true"], "additional properties 'enable' not allowed"),
        (["watchNamespaces={Team_A}"], "/watchNamespaces/0"),
        (["alerts.pendingFor=soon"], "/alerts/pendingFor"),
        (["admissionPolicy.images.allowed={ghcr.io/team*}"], "/admissionPolicy/images/allowed/0"),
        (["clusterWide=false"], "clusterWide=false needs the namespaces to watch"),
        # The release namespace holds the operator's keys: no job there, so never watched.
        (["watchNamespaces={team-a,megatron-system}"], "lists megatron-system, the operator's own"),
        (["admissionPolicy.forbiddenTolerationKeys={x}"], "additional properties"),
        (
            ["metrics.secure=false", "metrics.serviceMonitor.enabled=true"],
            "loopback only: nothing can scrape it",
        ),
    ],
)
def test_schema_rejects_bad_values(sets: list[str], message: str) -> None:
    args = ["template", "mo", str(CHART), "-n", "megatron-system"]
    for item in sets:
        args += ["--set", item]
    proc = run_helm(*args, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_several_replicas_need_leader_election() -> None:
    proc = run_helm(
        "template",
        "mo",
        str(CHART),
        "--set",
        "watchNamespaces={team-a}",
        "--set",
        "replicas=3",
        "--set",
        "leaderElection.enabled=false",
        check=False,
    )
    assert proc.returncode != 0
    assert "replicas > 1 needs leaderElection.enabled=true" in proc.stderr


def _args(objs: list[dict[str, Any]]) -> list[str]:
    deploy = one(objs, "Deployment")
    return list(deploy["spec"]["template"]["spec"]["containers"][0]["args"])


def test_deployment_flags_probes_and_priority() -> None:
    objs = render()
    args = _args(objs)
    assert args[0] == "operator"
    assert "--leader-elect" in args and "--network-policy" in args and "--kueue=off" in args
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    # No PriorityClass by default: GKE refuses system-cluster-critical outside kube-system.
    assert "priorityClassName" not in pod
    assert (
        one(render("priorityClassName=train-critical"), "Deployment")["spec"]["template"]["spec"][
            "priorityClassName"
        ]
        == "train-critical"
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"

    off = _args(render("networkPolicy=false", "leaderElection.enabled=false", "kueue.enabled=true"))
    assert "--network-policy" not in off and "--leader-elect" not in off and "--kueue=on" in off
    ns = _args(render("watchNamespaces={team-a,team-b}"))
    assert "--namespace=team-a" in ns and "--namespace=team-b" in ns
    # The default watches every namespace: a job runs in its team's namespace as written.
    assert not [a for a in args if a.startswith("--namespace")]
    # Probes on the health port; /metrics over HTTPS for authorized tokens, or loopback only.
    assert container["readinessProbe"]["httpGet"]["port"] == "health"
    assert {"--metrics-auth=kubernetes", "--metrics-bind-address=0.0.0.0"} <= set(args)
    assert "--claim-key-file=/etc/megatron-operator/claim-key/key" in args
    loop = render("metrics.secure=false")
    assert "--metrics-bind-address=127.0.0.1" in _args(loop)
    assert of_kind(loop, "Service") == [] and not [
        o for o in of_kind(loop, "Secret") if o["metadata"]["name"].endswith("-metrics-tls")
    ]


def test_ha_render() -> None:
    objs = render("replicas=2", "podDisruptionBudget.enabled=true")
    deploy = one(objs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = one(objs, "PodDisruptionBudget")
    assert (
        pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["template"]["metadata"]["labels"]
    )
    election = [
        r for r in of_kind(objs, "Role") if r["metadata"]["name"].endswith("-leader-election")
    ]
    assert election and election[0]["metadata"]["namespace"] == "megatron-system"
    assert rules_for(election[0]["rules"], "leases") == {"get", "create", "update"}


def test_namespaced_mode_grants_roles_in_watched_namespaces_only() -> None:
    objs = render("watchNamespaces={team-a,team-b}")
    cluster_rules = operator_role(objs)["rules"]
    cluster_resources = {res for r in cluster_rules for res in r["resources"]}
    # Only cluster-scoped reads (and the metrics port's token reviews): no pod, RBAC or job
    # right cluster-wide.
    reviews = {"tokenreviews", "subjectaccessreviews"}
    assert cluster_resources == {"nodes", "namespaces", "customresourcedefinitions", *reviews}
    assert all(
        set(r["verbs"]) <= {"get", "list", "watch"}
        or (set(r["resources"]) <= reviews and r["verbs"] == ["create"])
        for r in cluster_rules
    )
    roles = {
        r["metadata"]["namespace"]: r
        for r in of_kind(objs, "Role")
        if not r["metadata"]["name"].endswith("-leader-election")
    }
    assert set(roles) == {"team-a", "team-b"}
    bindings = {
        b["metadata"]["namespace"]
        for b in of_kind(objs, "RoleBinding")
        if not b["metadata"]["name"].endswith("-leader-election")
    }
    assert bindings == {"team-a", "team-b"}
    rules = roles["team-a"]["rules"]
    assert rules_for(rules, "pods") >= {"create", "delete", "watch"}
    assert "update" not in rules_for(rules, "megatronjobs")
    # The jobs' coordinator keys: created, read back for the ownership check, never updated.
    assert rules_for(rules, "secrets") == {"get", "list", "create", "delete"}

    # Cluster-wide mode (the default): the same namespaced rules, in the ClusterRole, no Role.
    wide = render()
    assert rules_for(operator_role(wide)["rules"], "pods") == rules_for(rules, "pods")
    assert [
        r for r in of_kind(wide, "Role") if not r["metadata"]["name"].endswith("-election")
    ] == []


def test_kueue_and_network_policy_rights_follow_their_values() -> None:
    plain = render("networkPolicy=false", "watchNamespaces={team-a}")
    plain_rules = [*operator_role(plain)["rules"], *of_kind(plain, "Role")[0]["rules"]]
    groups = {g for r in plain_rules for g in r["apiGroups"]}
    assert "kueue.x-k8s.io" not in groups and "networking.k8s.io" not in groups
    assert "scheduling.k8s.io" not in groups

    objs = render("kueue.enabled=true", "watchNamespaces={team-a}")
    role = next(r for r in of_kind(objs, "Role") if r["metadata"]["namespace"] == "team-a")
    # Exactly what the operator calls (measured with the chart's token against real Kueue).
    assert rules_for(role["rules"], "workloads") == {
        "get",
        "list",
        "watch",
        "create",
        "delete",
        "patch",
    }
    assert rules_for(role["rules"], "workloads/status") == {"patch"}
    assert rules_for(role["rules"], "localqueues") == set()
    assert rules_for(role["rules"], "networkpolicies") == {"get", "list", "create", "delete"}
    cluster = operator_role(objs)["rules"]
    assert rules_for(cluster, "clusterqueues") == set()
    assert rules_for(cluster, "resourceflavors") == {"get"}
    assert rules_for(cluster, "workloadpriorityclasses") == {"get"}
    assert rules_for(cluster, "priorityclasses") == {"get"}


def test_crd_is_the_generated_one_and_kept_on_uninstall() -> None:
    crds = {c["metadata"]["name"]: c for c in of_kind(render(), "CustomResourceDefinition")}
    assert set(crds) == {"megatronjobs.megatron.dev", "megatronjobdefaults.megatron.dev"}
    for name, crd in crds.items():
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        generated = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
        del crd["metadata"]["annotations"]
        assert crd == generated
    assert of_kind(render("crds.install=false"), "CustomResourceDefinition") == []
    # Helm would install crds/ on every install and conflict with the template.
    assert not (CHART / "crds").exists()


def test_scrape_annotations_follow_the_port() -> None:
    objs = render("metrics.port=9100")
    pod = one(objs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    svc = one(objs, "Service")["metadata"]["annotations"]
    for found in (pod, svc):
        assert found["prometheus.io/scrape"] == "true"
        assert found["prometheus.io/port"] == "9100"
    off = render("metrics.scrapeAnnotations=false")
    annotations = one(off, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert not [k for k in annotations if k.startswith("prometheus.io/")]


def test_the_default_install_watches_every_namespace() -> None:
    """What platform teams expect (Kueue, JobSet, the Kubeflow Trainer install so): a job applied
    in any namespace gets a status, with the job rights in one ClusterRole and no Role."""
    objs = render()
    rules = operator_role(objs)["rules"]
    assert rules_for(rules, "pods") == {"get", "list", "watch", "create", "delete"}
    roles = [r for r in of_kind(objs, "Role") if not r["metadata"]["name"].endswith("-election")]
    assert roles == []


def test_listing_namespaces_is_the_narrowest_install() -> None:
    objs = render("watchNamespaces={team-a}")
    wide = operator_role(objs)["rules"]
    assert rules_for(wide, "pods") == set()  # nothing namespaced cluster-wide
    roles = [r for r in of_kind(objs, "Role") if not r["metadata"]["name"].endswith("-election")]
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a"]
    rules = roles[0]["rules"]
    # The garbage collector deletes a job's progress Lease; the operator may not.
    assert rules_for(rules, "leases") == {"get", "list", "watch", "create", "update", "patch"}
    # The metrics reader role for Prometheus, and the guardrail policies, are on by default.
    reader = next(
        r for r in of_kind(objs, "ClusterRole") if r["metadata"]["name"].endswith("-metrics-reader")
    )
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    names = {p["metadata"]["name"] for p in of_kind(objs, "ValidatingAdmissionPolicy")}
    assert {"mo-megatron-operator-operator-writes", "mo-megatron-operator-trainer-leases"} <= names
    # NOTES.txt says so: tests/integration/test_chart.py reads it from `helm install`.


def test_the_cluster_wide_values_comment_says_what_it_grants() -> None:
    """The comment above clusterWide in values.yaml names exactly the namespaced rights the
    cluster-wide ClusterRole grants (with networkPolicy and kueue.enabled on)."""
    text = (CHART / "values.yaml").read_text()
    comment = text[text.index("# With watchNamespaces empty") : text.index("clusterWide: true")]
    flat = " ".join(line.lstrip("#").strip() for line in comment.splitlines())
    said: dict[str, set[str]] = {}
    for names, verbs in re.findall(r"((?:[a-z/]+(?:, | and )?)+) \(([a-z, ]+)\)", flat):
        for name in re.split(r", | and ", names):
            said[name] = set(verbs.split(", "))
    cluster_reads = {"nodes", "namespaces", "customresourcedefinitions", "tokenreviews",
                     "subjectaccessreviews", "resourceflavors", "workloadpriorityclasses",
                     "priorityclasses"}  # fmt: skip
    granted: dict[str, set[str]] = {}
    for rule in operator_role(render("kueue.enabled=true"))["rules"]:
        for resource in rule["resources"]:
            if resource not in cluster_reads:
                granted.setdefault(resource, set()).update(rule["verbs"])
    assert said == granted


def test_the_multi_tenant_profile_turns_the_admission_policy_on() -> None:
    proc = run_helm(
        "template",
        "mo",
        str(CHART),
        "-f",
        MULTI_TENANT,
        "--set",
        "watchNamespaces={a}",
        check=False,
    )
    assert proc.returncode != 0 and "admissionPolicy.images.allowed is empty" in proc.stderr
    objs = render("admissionPolicy.images.allowed={registry.example.com/ml/*}", values=MULTI_TENANT)
    policy = next(
        p
        for p in of_kind(objs, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-limits")
    )
    text = " ".join(" ".join(v["expression"].split()) for v in policy["spec"]["validations"])
    assert "nodeSelector.all(k, k in ['nvidia.com/gpu.product'," in text
    assert "imagePullPolicy == 'Always'" in text
    assert "['registry.example.com/ml/*'].exists(a" in text
    assert "[{'effect':'NoSchedule','key':'nvidia.com/gpu','operator':'Exists'}].exists(a" in text


def _job_defaults(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"].endswith("-defaults")]
    parsed: dict[str, Any] = json.loads(cm["data"]["defaults.json"])
    return parsed


def test_openshift_values_fix_no_uid_anywhere() -> None:
    """restricted-v2 assigns the uid, gid and fsGroup: neither the operator pod nor a trainer
    pod (through the operator's --job-defaults) may fix them."""
    objs = render(
        "podSecurityContext.runAsUser=null",
        "trainerPods.runAsUser=null",
        "trainerPods.runAsGroup=null",
        "trainerPods.fsGroup=null",
    )
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    defaults = _job_defaults(objs)
    assert defaults["podSecurityContext"] == {}
    job = job_of({"image": DELETE})
    trainer = next(
        o
        for o in render_job(job, plan(job.spec), platform=platform(defaults))
        if o["kind"] == "Pod"
    )
    assert trainer["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # The defaults: the images' user, the chart's trainer image, and its own operator image as
    # a trainer.command's launcher image (the init container that copies the launcher).
    plain = _job_defaults(render())
    assert plain == {
        "image": DEFAULT_TRAINER_IMAGE,
        "launcherImage": DEFAULT_LAUNCHER_IMAGE,
        "podSecurityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000},
    }
    assert platform(plain).launcher_image == DEFAULT_LAUNCHER_IMAGE
    moved = _job_defaults(render("image.repository=registry.example/ops/operator", "image.tag=v7"))
    assert platform(moved).launcher_image == "registry.example/ops/operator:v7"


def test_the_trainer_service_account_gets_the_clouds_annotations() -> None:
    role = "arn:aws:iam::111122223333:role/training"
    objs = render(
        f"trainerPods.serviceAccountAnnotations.eks\\.amazonaws\\.com/role-arn={role}",
        "trainerImage.repository=registry.example/ml/trainer",
        "jobDefaults.env[0].name=NCCL_DEBUG",
        "jobDefaults.env[0].value=WARN",
    )
    defaults = _job_defaults(objs)
    assert read_defaults_from(defaults) == defaults  # the operator accepts it as it is
    job = job_of({"image": DELETE})
    made = render_job(load_job_with(job, defaults), plan(job.spec), platform=platform(defaults))
    account = next(o for o in made if o["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": role}
    pod = next(o for o in made if o["kind"] == "Pod")
    tag = DEFAULT_TRAINER_IMAGE.rsplit(":", 1)[1]
    assert pod["spec"]["containers"][0]["image"] == f"registry.example/ml/trainer:{tag}"
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in pod["spec"]["containers"][0]["env"]
    # A change of the defaults rolls the operator, which reads them at start.
    sums = {
        one(o, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/job-defaults"]
        for o in (objs, render())
    }
    assert len(sums) == 2


def test_monitors_use_authorization_with_the_charts_own_token() -> None:
    objs = render("metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true")
    for kind, key in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        (endpoint,) = one(objs, kind)["spec"][key]
        assert "bearerTokenFile" not in endpoint
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": "mo-megatron-operator-metrics-token", "key": "token"},
        }
    token = next(s for s in of_kind(objs, "Secret") if s["metadata"]["name"].endswith("-token"))
    assert token["type"] == "kubernetes.io/service-account-token"
    account = token["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    binding = next(
        b for b in of_kind(objs, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-metrics")
    )
    assert binding["roleRef"]["name"] == "mo-megatron-operator-metrics-reader"
    assert binding["subjects"][0]["name"] == account
    # Their own Secret: none of the chart's.
    own = render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.tokenSecret=prom")
    (endpoint,) = one(own, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"]["name"] == "prom"
    assert not [s for s in of_kind(own, "Secret") if s["metadata"]["name"].endswith("-token")]


def test_helm_template_is_stable_with_existing_secrets() -> None:
    """Argo CD renders with `helm template`, where lookup finds nothing: the generated key and
    certificate change on every render, the named Secrets do not."""
    stable = ["claimKey.existingSecret=megatron-claim-key", "metrics.certSecret=megatron-tls"]
    first, second = render(*stable), render(*stable)
    assert first == second
    assert not [s for s in of_kind(first, "Secret") if s["metadata"]["name"].endswith("-claim-key")]
    volumes = one(first, "Deployment")["spec"]["template"]["spec"]["volumes"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == {"claim-key": "megatron-claim-key", "metrics-tls": "megatron-tls"}
    generated = [render(), render()]
    keys = [
        next(s for s in of_kind(objs, "Secret") if s["metadata"]["name"].endswith("-claim-key"))
        for objs in generated
    ]
    assert keys[0]["data"] != keys[1]["data"]  # why the value exists


def test_global_aggregated_roles_and_the_queue_requirement() -> None:
    objs = render("global.imageRegistry=registry.example", "kueue.enabled=true",
                  "kueue.requireQueueLabel=true")  # fmt: skip
    assert "--require-queue-label" in _args(objs)
    roles = {r["metadata"]["name"]: r for r in of_kind(objs, "ClusterRole")}
    edit = roles["mo-megatron-operator-edit"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert rules_for(edit["rules"], "megatronjobs") >= {"create", "delete", "patch"}
    assert rules_for(edit["rules"], "megatronjobdefaults") == {"get", "list", "watch"}
    assert rules_for(edit["rules"], "megatronjobs/status") == set()
    view = roles["mo-megatron-operator-view"]
    assert rules_for(view["rules"], "megatronjobs") == {"get", "list", "watch"}
    admin = roles["mo-megatron-operator-admin"]
    assert "create" in rules_for(admin["rules"], "megatronjobdefaults")
    assert not [r for r in of_kind(render("aggregateRoles=false"), "ClusterRole") if
                r["metadata"]["name"].endswith(("-edit", "-view", "-admin"))]  # fmt: skip
    proc = run_helm(
        "template", "mo", str(CHART), "--set", "kueue.requireQueueLabel=true", check=False
    )
    assert proc.returncode != 0 and "needs kueue.enabled=true" in proc.stderr


def test_no_pod_of_a_job_can_join_the_operators_service_or_reach_its_other_ports() -> None:
    """The metrics Service, the PDB and the PodMonitor select the operator's pods by a
    megatron.dev/ label as well, which the CRD refuses in a job's pod template; a NetworkPolicy
    admits connections to the metrics and health ports only."""
    objs = render("podDisruptionBudget.enabled=true", "metrics.podMonitor.enabled=true",
                  "metrics.podMonitor.tokenSecret=t")  # fmt: skip
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["megatron.dev/operator"] == "mo"
    selectors = [
        one(objs, "Service")["spec"]["selector"],
        one(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(objs, "PodMonitor")["spec"]["selector"]["matchLabels"],
        one(objs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ]
    assert all(s == pod_labels for s in selectors), selectors
    policy = one(objs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [8443, 8081]
    assert not [o for o in render("operatorNetworkPolicy=false") if o["kind"] == "NetworkPolicy"]
