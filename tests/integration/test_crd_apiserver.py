"""The generated CRD on a real kube-apiserver: the CEL rules reject exactly what the planner
rejects, every adversarial file `mjob validate` refuses is refused here too, transition rules
guard running jobs, and `kubectl explain` shows the descriptions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from megatron_contract.bounds import MAX_NODES
from megatron_operator.api import load_job, parse_yaml
from tests.unit.adversarial import CASES as ADVERSARIAL
from tests.unit.adversarial import Case, _file
from tests.unit.specs import spec_of
from tests.unit.test_rules import CASES

from .conftest import Cluster
from .operator_support import install_crd


@pytest.fixture(scope="module")
def custom(cluster: Cluster) -> Any:
    import kubernetes

    install_crd(cluster)
    return kubernetes.client.CustomObjectsApi(cluster.api_client())


def _dry_run(custom: Any, namespace: str, spec: dict[str, Any], name: str = "probe") -> str | None:
    """None when the apiserver accepts the object, else its error message."""
    body = {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    try:
        custom.create_namespaced_custom_object(
            "megatron.dev", "v1alpha1", namespace, "megatronjobs", body, dry_run="All"
        )
    except ApiException as exc:
        return str(json.loads(exc.body).get("message", exc.body))
    return None


CEL_CASES = [c for c in CASES if c[4]]


@pytest.mark.parametrize("case", CEL_CASES, ids=[c[0] for c in CEL_CASES])
def test_apiserver_agrees_with_the_planner(custom: Any, namespace: str, case: Any) -> None:
    _, field, valid, invalid, _ = case
    assert _dry_run(custom, namespace, spec_of(valid)) is None
    message = _dry_run(custom, namespace, spec_of(invalid))
    assert message is not None, "the apiserver accepted an invalid layout"
    assert field in message, message


def test_planner_only_rules_pass_the_apiserver(custom: Any, namespace: str) -> None:
    # The memory budget is the planner's (too rich for CEL): the operator reports InvalidSpec.
    spec = spec_of({"model.recipe": "llama3-8b", "resources.gpuMemoryGiB": 24})
    assert _dry_run(custom, namespace, spec) is None


def _post_yaml(custom: Any, namespace: str, text: str) -> tuple[int, dict[str, Any]]:
    """Send a file's YAML as it is (the apiserver parses it, as it does for `kubectl create
    --raw`), server-side dry run, with the strict field validation kubectl uses by default.
    Returns the HTTP status and the decoded reply."""
    api = custom.api_client
    path = f"/apis/megatron.dev/v1alpha1/namespaces/{namespace}/megatronjobs"
    headers = {"Content-Type": "application/yaml", "Accept": "application/json"}
    # The client's own connection pool (its TLS and client certificate), not call_api: that
    # method's signature differs between client majors, and the raw body is what is sent here.
    auth = api.configuration.auth_settings().get("BearerToken")
    if auth and auth.get("value"):
        headers[auth["key"]] = auth["value"]
    response = api.rest_client.pool_manager.request(
        "POST",
        f"{api.configuration.host}{path}?dryRun=All&fieldValidation=Strict",
        body=text.encode(),
        headers=headers,
        timeout=60,
    )
    status, data = response.status, response.data
    try:
        return status, dict(json.loads(data))
    except (TypeError, ValueError):
        return status, {"message": str(data)}


def _in_namespace(case: Case, namespace: str) -> str:
    # The files name namespace default; the request goes to the test's namespace.
    return case.text.replace("\n  namespace: default\n", f"\n  namespace: {namespace}\n", 1)


@pytest.mark.parametrize("case", ADVERSARIAL, ids=[c.id for c in ADVERSARIAL])
def test_apiserver_refuses_what_mjob_validate_refuses(
    custom: Any, namespace: str, case: Case
) -> None:
    status, reply = _post_yaml(custom, namespace, _in_namespace(case, namespace))
    message = str(reply.get("message", reply))
    assert 400 <= status < 500, f"the apiserver accepted it ({status}): {message[:500]}"
    assert case.apiserver_fragment in message, message[:2000]


def test_a_million_nodes_names_the_cap(custom: Any, namespace: str) -> None:
    status, reply = _post_yaml(
        custom, namespace, _file({"resources.nodes": 1_000_000}, namespace=namespace)
    )
    assert status == 422
    message = reply["message"]
    assert "spec.resources.nodes" in message and str(MAX_NODES) in message, message


def test_the_adversarial_baseline_is_accepted(custom: Any, namespace: str) -> None:
    # Each case changes this file; it alone must pass, or the refusals above prove nothing.
    status, reply = _post_yaml(custom, namespace, _file({}, namespace=namespace))
    assert status == 201, reply


@pytest.mark.parametrize("text", ["3e-4", "3E-4", "1e-4"])
def test_lr_written_the_ml_way_is_a_number_to_the_apiserver(
    custom: Any, namespace: str, text: str
) -> None:
    body = _file({}, namespace=namespace).replace("  training:\n", f"  training:\n    lr: {text}\n")
    status, reply = _post_yaml(custom, namespace, body)
    assert status == 201, reply
    assert reply["spec"]["training"]["lr"] == float(text)


@pytest.mark.parametrize(
    ("field", "text"),
    [
        *[("lr", t) for t in ("3e-4", "1E-4", ".5e-3", "5.e-4", "+3e-4", "3.0E-04")],
        *[("seed", t) for t in ("0x10", "017", "0o17", "0b101", "1_000", "+100")],
    ],
)
def test_numbers_read_the_same_by_mjob_and_the_apiserver(
    custom: Any, namespace: str, field: str, text: str
) -> None:
    body = _file({}, namespace=namespace).replace(
        "  training:\n", f"  training:\n    {field}: {text}\n"
    )
    ours = load_job(parse_yaml(body)).spec.training.to_api()[field]
    status, reply = _post_yaml(custom, namespace, body)
    assert status == 201, reply
    assert reply["spec"]["training"][field] == ours


def test_bad_name_rejected(custom: Any, namespace: str) -> None:
    message = _dry_run(custom, namespace, spec_of(), name="x" * 51)
    assert message is not None and "at most 50" in message


def test_transition_rules_guard_a_running_job(
    cluster: Cluster, namespace: str, custom: Any
) -> None:
    body = {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": "guarded"},
        "spec": spec_of(),
    }
    custom.create_namespaced_custom_object(
        "megatron.dev", "v1alpha1", namespace, "megatronjobs", body
    )

    def patch(spec: dict[str, Any]) -> str | None:
        try:
            custom.patch_namespaced_custom_object(
                "megatron.dev", "v1alpha1", namespace, "megatronjobs", "guarded", {"spec": spec}
            )
        except ApiException as exc:
            return str(json.loads(exc.body).get("message"))
        return None

    assert patch({"training": {"trainIters": 500}}) is None  # any time
    message = patch({"model": {"numLayers": 8}})
    assert message is not None and "immutable" in message
    message = patch({"resources": {"nodes": 1}})
    assert message is not None and "suspended" in message
    assert patch({"suspend": True}) is None
    assert patch({"resources": {"nodes": 1}}) is None  # a resize while suspended
    message = patch({"training": {"globalBatchSize": 32}})
    assert message is not None and "immutable" in message


def test_kubectl_explain(cluster: Cluster, custom: Any) -> None:
    out = cluster.kubectl("explain", "megatronjob.spec.parallelism.tensor").stdout
    assert "Tensor-parallel size" in out
    out = cluster.kubectl("explain", "mj.spec.restartPolicy.rules").stdout
    assert "exitCodes" in out and "reasons" in out
