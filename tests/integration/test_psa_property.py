"""A property test: every pod the operator renders for a random valid spec is admitted by Pod
Security "restricted" on a namespace that enforces it (and is a valid Pod by the Kubernetes
schema), except the one documented case, an rdma/* request (IPC_LOCK), which the apiserver then
refuses. The examples alone (tests/integration/test_security.py) cover only five specs."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes
import kubernetes_validate
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from megatron_operator.api import SpecError, load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import children
from megatron_operator.core.render import pods as render_pods
from tests.unit.specs import job_doc, spec_of

from .conftest import Cluster

EXAMPLES = 60

_LABEL_KEY = st.sampled_from(
    ["nvidia.com/gpu.product", "topology.kubernetes.io/zone", "example.com/pool", "pool"]
)
_LABEL_VALUE = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
_QUANTITY = st.sampled_from(["1", "500m", "2Gi", "64Gi", "1e3", "0.5"])


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid specs (the layout drawn to fit), with the pod-shaping fields varied."""
    cpu = draw(st.booleans())
    ppn = draw(st.sampled_from([1, 2, 4] if cpu else [8, 16]))
    nodes = draw(st.integers(1, 3))
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if ppn % t == 0]))
    world = nodes * ppn
    pp = draw(st.sampled_from([p for p in (1, 2) if (world // tp) % p == 0 and world % tp == 0]))
    changes: dict[str, Any] = {
        "parallelism.tensor": tp,
        "parallelism.pipeline": pp,
        "resources.nodes": nodes,
        "resources.procsPerNode": ppn,
        "training.globalBatchSize": 96 * draw(st.integers(1, 4)),
        "model.recipe": "gpt-tiny",
    }
    if cpu:
        changes["resources.accelerator"] = "none"
    if draw(st.booleans()):
        changes["resources.nodeSelector"] = draw(
            st.dictionaries(_LABEL_KEY, _LABEL_VALUE, max_size=3)
        )
    if draw(st.booleans()):
        changes["resources.tolerations"] = [
            {"key": k, "operator": "Exists", "effect": e}
            for k, e in draw(
                st.lists(
                    st.tuples(_LABEL_KEY, st.sampled_from(["NoSchedule", "NoExecute"])), max_size=2
                )
            )
        ]
    if draw(st.booleans()):
        changes["resources.requests"] = draw(
            st.dictionaries(st.sampled_from(["cpu", "memory", "ephemeral-storage"]), _QUANTITY)
        )
        changes["resources.limits"] = draw(
            st.dictionaries(st.sampled_from(["cpu", "memory"]), _QUANTITY)
        )
    if draw(st.booleans()):
        changes["resources.shmSize"] = draw(_QUANTITY)
    if draw(st.booleans()):
        changes["env"] = [
            {"name": n, "value": v}
            for n, v in draw(
                st.dictionaries(
                    st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
                    st.text(max_size=20),
                    max_size=4,
                )
            ).items()
        ]
    if draw(st.booleans()):
        changes["topology"] = {
            "key": draw(_LABEL_KEY),
            "mode": draw(st.sampled_from(["required", "preferred", "none"])),
        }
    if draw(st.booleans()):
        changes["checkpoint.volume"] = {"create": {"size": "10Gi"}}
    changes["checkpoint.gracePeriodSeconds"] = draw(st.integers(1, 3600))
    changes["imagePullPolicy"] = draw(st.sampled_from(["Always", "IfNotPresent", "Never"]))
    return spec_of(changes)


def test_every_rendered_pod_passes_pod_security_restricted(
    cluster: Cluster, namespace: str
) -> None:
    ns = namespace
    cluster.kubectl(
        "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    core = kubernetes.client.CoreV1Api(cluster.api_client())
    admitted = skipped = 0
    accounts: set[str] = set()

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(spec=specs(), attempt=st.integers(0, 10**6))
    def one(spec: dict[str, Any], attempt: int) -> None:
        nonlocal admitted, skipped
        doc = job_doc(copy.deepcopy(spec), name=f"psa{len(accounts) % 5}", namespace=ns)
        doc["metadata"]["uid"] = "0000-uid"
        try:
            job = load_job(doc)
            p = plan(job.spec)
        except SpecError:
            # An invalid spec (a memory limit below what the in-memory checkpoints hold, a
            # request above its limit): nothing is rendered for it, and it does not count as
            # one of the examples, so every run renders as many pods (a run that drew many
            # invalid ones had too few to show anything).
            skipped += 1
            reject()
        (account,) = [o for o in children(job, p) if o["kind"] == "ServiceAccount"]
        name = account["metadata"]["name"]
        if name not in accounts:  # pod admission needs the ServiceAccount; ownerless here
            account["metadata"].pop("ownerReferences")
            core.create_namespaced_service_account(ns, account)
            accounts.add(name)
        for pod in render_pods(job, p, attempt)[:2]:
            kubernetes_validate.validate(pod, "1.34.0", strict=True)
            pod["metadata"].pop("ownerReferences")
            try:
                core.create_namespaced_pod(ns, pod, dry_run="All")
            except kubernetes.client.exceptions.ApiException as exc:
                raise AssertionError(
                    f"refused at restricted: {exc.body}\nspec: {json.dumps(spec)[:2000]}"
                ) from None
            admitted += 1

    one()
    assert admitted >= EXAMPLES, (admitted, skipped)  # each valid example renders a pod or two

    # The level is enforced here: the one documented exception is refused.
    job = load_job(
        job_doc(spec_of({"resources.limits": {"rdma/ib": 1}}), name="psa0", namespace=ns)
        | {"metadata": {"name": "psa0", "namespace": ns, "uid": "0000-uid"}}
    )
    pod = render_pods(job, plan(job.spec), 0)[0]
    pod["metadata"].pop("ownerReferences")
    try:
        core.create_namespaced_pod(ns, pod, dry_run="All")
    except kubernetes.client.exceptions.ApiException as exc:
        assert "IPC_LOCK" in str(exc.body)
    else:
        raise AssertionError("an rdma/* pod was admitted at restricted")
