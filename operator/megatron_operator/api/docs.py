"""Render the API reference (docs/api.md) from the generated CRD schema."""

from __future__ import annotations

import json
from typing import Any, get_args

from megatron_contract.recipes import RECIPES

from . import podtypes, volumes
from .cel import SPEC_RULES, TRANSITION_RULES
from .crd import PRINTER_COLUMNS, crd, defaults_crd, model_paths
from .spec import FailureReason, MegatronJobSpec
from .status import ConditionType, Phase, Reason, Rung

_INTRO = """\
# API reference: `MegatronJob` (megatron.dev/v1alpha1)

Generated from the pydantic models by `python -m megatron_operator.api.gen`; a test fails when this
file is stale. `kubectl explain megatronjob.spec` shows the same descriptions.

Short names: `mj`, `mjob`. Namespaced, with a status subresource. Printer columns: {columns}.
"""

_CHANGES = """\
## Changing a job

| fields | may change |
|---|---|
| `spec.model`, `spec.training.globalBatchSize`, `spec.checkpoint.volume`, `spec.checkpoint.path`, `spec.checkpoint.url` | never: checkpoints and the data order depend on them |
| `spec.image`, `imagePullPolicy`, `parallelism`, `resources`, `topology`, `data`, `env`, `priorityClassName`, `trainer`, `template`, `checkpoint.shardingType`, `checkpoint.msc`, the other `training` fields | only while the job stays suspended (`spec.suspend: true` before and after): a resize, e.g. fewer nodes with a new `data` size |
| `spec.suspend`, `restartPolicy`, `activeDeadlineSeconds`, `ttlSecondsAfterFinished`, `training.trainIters`, `training.logInterval`, `profiling`, `checkpoint.saveInterval`, `keep`, `async`, `gracePeriodSeconds` | any time; pod-level settings apply from the next attempt (an attempt restarted in place keeps its pods: its ranks read the refreshed config once the kubelet has synced the mounted ConfigMap, typically within a minute, and `restartPolicy.strategy` changes how the pods' launchers handle a failed rank only for pods created after it) |

The apiserver enforces this with CEL transition rules; the operator checks it again for objects
that bypassed validation.
"""

_FAILURES = """\
## Failure rules

`spec.restartPolicy.rules` are tried in order, then the built-in defaults below; the first rule
whose `exitCodes` (if given) and `reasons` (if given) both match decides the action.

Reasons the operator assigns: `Error` (the trainer exited non-zero), `OOMKilled` (the container
was OOM-killed), `Evicted` (the kubelet evicted the pod), `DisruptionTarget` (the pod condition set
on an API eviction, a drain or a taint), `Preempted` (DisruptionTarget by the scheduler's
preemption), `NodeLost` (the pod's node is NotReady or gone), `PodDeleted` (someone deleted a
running pod), `Hang` (Running with no progress for `hangTimeoutSeconds`, or a new gang with no
first step within `firstStepTimeoutSeconds`), `KueueEviction` (Kueue
took the quota back), `StartupTimeout` (not every pod Running `startupTimeoutSeconds` after the
first was scheduled),
`LauncherLost` (a pod's launcher dropped its connection to the rendezvous host: its container
died or its network failed), `RestartTimeout` (the ranks of an in-place restart or a pod
replacement reported no step within `inPlaceTimeoutSeconds`).

The rules decide whether to restart; how is the restart ladder's choice, the lowest rung that
can recover (`status.lastFailure.rung`): `InPlace` (every rank restarted in the running pods),
`ReplacePod` (a lost pod recreated, the other pods restart their ranks in place), `Recreate`
(every pod recreated: `strategy: Recreate`, node rank 0's pod lost, an in-place restart or pod
replacement that failed before its first step, or a node that failed twice since the gang was
last recreated).

Built-in defaults, after your rules:

| # | matches | action |
|---|---|---|
| 1 | reasons `DisruptionTarget`, `Preempted`, `Evicted`, `NodeLost`, `KueueEviction` | `RestartNotCounted` |
| 2 | exit code 78 (the trainer's configuration error) | `Fail` |
| 3 | exit code 143 (the trainer saved a checkpoint after SIGTERM) | `RestartNotCounted` |
| 4 | exit code 17 (the loss or gradients became NaN/Inf; nothing was saved for that step) | `Fail` |
| 5 | anything else | `Restart` |
"""


_TEMPLATE = """\
## The pod template

`spec.template` lays the cluster's conventions over every pod the operator renders, as a
strategic merge patch of a PodSpec would: `volumes`, `initContainers`, `containers` and
`imagePullSecrets` merge by name (an entry named like one of the operator's replaces it, any other
is added); the container named `trainer` merges its `env` (by name), `envFrom`, `volumeMounts`
(by mount path) and `resources` entries (key by key) into the operator's trainer container;
labels, annotations, `nodeSelector` and `securityContext` merge key by key; `affinity` terms and
`tolerations` are added to the operator's (one pod per node and the topology packing hold);
`schedulerName`, `runtimeClassName` and `dnsConfig` are set. What the operator owns is refused by
the CRD and by `mjob validate`, each with why: `restartPolicy`, `hostname`, `subdomain`,
`serviceAccountName`, `serviceAccount`, `nodeName`, `terminationGracePeriodSeconds` and
`priorityClassName`; the volumes `config`, `checkpoints`, `dshm`, `megatron-data`,
`megatron-init`, `megatron-msc-config` and `megatron-scratch` and their mount paths; the contract env (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
every `MEGATRON_` name, …); the `megatron.dev/` and `kueue.x-k8s.io/` labels; and the trainer
container's image, command, arguments and other fields.

Nested Kubernetes objects (a volume's source, a probe, an affinity term, a security context) have
the fields of Kubernetes 1.34 (its API reference documents them; they are not listed above), each
list, map and string with a cap, and the whole template at most 4,096 values and 64 KiB of JSON:
every pod of the job carries it. Every container of the pods is held to the restricted Pod
Security level, whatever the namespace's level: no `privileged`, no `allowPrivilegeEscalation`,
no `runAsUser: 0` or `runAsNonRoot: false` (the pod's or a container's), capabilities added only
`NET_BIND_SERVICE` and `IPC_LOCK` (the operator drops `ALL` and forbids escalation on every init
container and sidecar that does not say so itself), no `procMount: Unmasked`, no `Unconfined`
seccomp or AppArmor profile, SELinux only a container type and level, only the namespaced safe
sysctls, no `hostPort` or `hostIP`, no `mountPropagation: Bidirectional`, no `host` in a probe or
hook. A pod affinity or anti-affinity term may not name `namespaces` or a `namespaceSelector`: it
applies to the job's own namespace. The apiserver checks the rest when the pod is created; a
refusal shows on the job as `CreateFailure` with the apiserver's message.
"""


_DEFAULTS = """\
## MegatronJobDefaults

What a platform team writes once for every job in a namespace (short name `mjd`): the trainer
image, env (NCCL settings), requests, node selector, tolerations, fabric, pod conventions (Multus
annotations, image pull secrets), the trainer pods' identity and the trainer ServiceAccount's
annotations (EKS IRSA, GKE Workload Identity). The operator's own defaults (`mjob operator
--job-defaults FILE`: the chart's `trainerImage`, `trainerPods` and `jobDefaults` values) have the
same fields and apply to every job.

Merged in this order, each under the next: the operator's defaults, the namespace's
MegatronJobDefaults (in name order), the job's own spec, which always wins. Maps merge key by
key; env, volumes, containers and image pull secrets by name; tolerations are added;
`resources.network` and `podSecurityContext` are taken whole from the most specific side that
sets them. A field the job leaves at the API's default (`imagePullPolicy: IfNotPresent`, fabric
`none`) counts as unset. The merged spec is validated as the job's own would be (the operator's
env names, pod fields and labels are refused; the CRD applies the same CEL rules to a defaults
object), and `mjob validate --defaults FILE` and `mjob render --defaults FILE` show the result.

The operator resolves a job's defaults once, when it first sees the job, and records them in
`status.defaults` (`sources`, and the merged `spec`): a later change of the defaults applies to
new jobs only, never to a running job's next attempt. A defaults object that does not validate
fails the jobs it would reach with `InvalidSpec` naming it; fixed, they start.

```yaml
apiVersion: megatron.dev/v1alpha1
kind: MegatronJobDefaults
metadata:
  name: platform
  namespace: team-a
spec:
  env: [{name: NCCL_DEBUG, value: WARN}]
  resources:
    requests: {cpu: "64", memory: 900Gi}
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  template:
    spec:
      imagePullSecrets: [{name: regcred}]
  serviceAccount:
    annotations: {eks.amazonaws.com/role-arn: "arn:aws:iam::111122223333:role/training"}
```

| field | type | required | default | description |
|---|---|---|---|---|
"""


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = node.get("type", "")
    if kind == "array":
        return f"list of {_type(node['items'])}"
    if kind == "object" and "additionalProperties" in node:
        return f"map of {_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return str(kind)


def _kubernetes_paths() -> set[str]:
    """Where a Kubernetes object (api/podtypes.py, api/volumes.py) sits: documented upstream, so
    its fields are not listed here."""
    return {
        path
        for path, model in model_paths(MegatronJobSpec, "spec")
        if model.__module__ in (podtypes.__name__, volumes.__name__)
    }


def _rows(
    node: dict[str, Any], prefix: str, out: list[str], stop: frozenset[str] = frozenset()
) -> None:
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}.{name}"
        default = prop.get("default")
        shown = "" if default is None or default == {} else f"`{json.dumps(default)}`"
        req = "yes" if name in required else ""
        desc = prop.get("description", "").replace("|", "\\|")
        out.append(f"| `{path}` | {_type(prop)} | {req} | {shown} | {desc} |")
        target = prop.get("items", prop) if prop.get("type") == "array" else prop
        inner = path + ("[]" if target is not prop else "")
        if "properties" in target and inner not in stop:
            _rows(target, inner, out, stop)


def render() -> str:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    columns = ", ".join(c["name"] for c in PRINTER_COLUMNS)
    lines = [_INTRO.format(columns=columns), "## Spec", ""]
    lines += ["| field | type | required | default | description |"]
    lines.append("|---|---|---|---|---|")
    _rows(schema["properties"]["spec"], "spec", lines, frozenset(_kubernetes_paths()))
    lines += ["", "## Status", "", "| field | type | required | default | description |"]
    lines.append("|---|---|---|---|---|")
    _rows(schema["properties"]["status"], "status", lines)
    lines += ["", "## Phases, conditions and reasons", ""]
    for title, enum in (
        ("Phases (`status.phase`)", Phase),
        ("Condition types", ConditionType),
        ("Condition and event reasons", Reason),
        ("Failure reasons (`status.lastFailure.reason`, `restartPolicy.rules[].reasons`)", None),
        ("Restart rungs (`status.lastFailure.rung`)", Rung),
    ):
        values = [str(v) for v in enum] if enum is not None else list(get_args(FailureReason))
        lines.append(f"- {title}: " + ", ".join(f"`{v}`" for v in values))
    lines += ["", "## Recipes", "", "| recipe | fields |", "|---|---|"]
    for name, fields in RECIPES.items():
        lines.append(f"| `{name}` | `{json.dumps(fields, separators=(', ', ': '))}` |")
    lines += ["", _CHANGES, _FAILURES, _TEMPLATE]
    defaults = defaults_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lines += [_DEFAULTS.rstrip("\n")]
    _rows(defaults["properties"]["spec"], "spec", lines)
    lines.append("")
    lines += [
        "## Server-side validation",
        "",
        f"The CRD carries {len(SPEC_RULES)} CEL rules on `spec` (cross-field layout checks that "
        f"read recipe defaults) and {len(TRANSITION_RULES)} transition rules. The planner "
        "(`mjob validate`) checks the same rules plus the per-GPU memory budget, and prints "
        "every problem with a suggested fix.",
        "",
    ]
    return "\n".join(lines)
