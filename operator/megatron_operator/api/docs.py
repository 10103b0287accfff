"""Render the API reference (docs/api.md) from the generated CRD schema."""

from __future__ import annotations

import json
from typing import Any, get_args

from megatron_contract.recipes import RECIPES

from .cel import SPEC_RULES, TRANSITION_RULES
from .crd import crd
from .spec import FailureReason
from .status import ConditionType, Phase, Reason, Rung

_INTRO = """\
# API reference: `MegatronJob` (megatron.dev/v1alpha1)

Generated from the pydantic models by `python -m megatron_operator.api.gen`; a test fails when this
file is stale. `kubectl explain megatronjob.spec` shows the same descriptions.

Short names: `mj`, `mjob`. Namespaced, with a status subresource. Printer columns: Phase, Layout,
GPUs, Restarts, Progress, Age.
"""

_CHANGES = """\
## Changing a job

| fields | may change |
|---|---|
| `spec.model`, `spec.training.globalBatchSize`, `spec.checkpoint.volume`, `spec.checkpoint.path`, `spec.checkpoint.url` | never: checkpoints and the data order depend on them |
| `spec.image`, `imagePullPolicy`, `parallelism`, `resources`, `topology`, `data`, `env`, `priorityClassName`, `checkpoint.shardingType`, `checkpoint.msc`, the other `training` fields | only while the job stays suspended (`spec.suspend: true` before and after): a resize, e.g. fewer nodes with a new `data` size |
| `spec.suspend`, `restartPolicy`, `ttlSecondsAfterFinished`, `training.trainIters`, `training.logInterval`, `profiling`, `checkpoint.saveInterval`, `keep`, `async`, `gracePeriodSeconds` | any time; pod-level settings apply from the next attempt (an attempt restarted in place keeps its pods: its ranks read the refreshed config once the kubelet has synced the mounted ConfigMap, typically within a minute, and `restartPolicy.strategy` changes how the pods' launchers handle a failed rank only for pods created after it) |

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
running pod), `Hang` (Running with no progress for `hangTimeoutSeconds`), `KueueEviction`,
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


def _rows(node: dict[str, Any], prefix: str, out: list[str]) -> None:
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}.{name}"
        default = prop.get("default")
        shown = "" if default is None or default == {} else f"`{json.dumps(default)}`"
        req = "yes" if name in required else ""
        desc = prop.get("description", "").replace("|", "\\|")
        out.append(f"| `{path}` | {_type(prop)} | {req} | {shown} | {desc} |")
        target = prop.get("items", prop) if prop.get("type") == "array" else prop
        if "properties" in target:
            _rows(target, path + ("[]" if target is not prop else ""), out)


def render() -> str:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lines = [_INTRO, "## Spec", "", "| field | type | required | default | description |"]
    lines.append("|---|---|---|---|---|")
    _rows(schema["properties"]["spec"], "spec", lines)
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
    lines += ["", _CHANGES, _FAILURES]
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
