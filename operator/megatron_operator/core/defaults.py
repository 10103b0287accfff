"""Job defaults (pure): merge the platform's MegatronJobDefaults under a job's own spec.

`resolve` turns the layers in scope (the operator's own defaults, then the namespace's objects in
name order) into one record, `status.defaults`; `apply` merges that record's fields under the
job's spec, which always wins; `platform` reads the two fields that only defaults hold (the
trainer ServiceAccount's annotations, the pods' fixed identity) for the renderer.

Merging, at every level: maps key by key (the more specific side wins a key), lists of named
things by name (env, volumes, containers, image pull secrets; a name on both sides merges the two
entries), tolerations and envFrom as a union, anything else whole from the more specific side.
`podSecurityContext` and `resources.network` are taken whole from the most specific side that
sets them (half of an identity or a fabric means nothing).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from megatron_operator.api import FieldError
from megatron_operator.api.defaults import (
    DEFAULT_UID,
    KIND,
    MAX_SOURCES,
    OPERATOR_SOURCE,
    MegatronJobDefaultsSpec,
    PodIdentity,
)
from megatron_operator.api.loader import field_errors

Path = tuple[str, ...]
# The trainer image of a job that names none when no defaults do: the name the release builds
# and the chart's trainerImage defaults to (docs/install.md, "Images").
DEFAULT_TRAINER_IMAGE = "ghcr.io/megatron-operator/trainer:0.3.0"
# The image of a trainer.command job's launcher init container when no defaults name one: the
# operator image of this release (the chart sets its own image, defaults `launcherImage`).
DEFAULT_LAUNCHER_IMAGE = "ghcr.io/megatron-operator/operator:0.3.0"
# Lists merged by a key of their entries ("[]" stands for any entry of the list above it).
_KEYED: dict[Path, str] = {
    ("env",): "name",
    ("template", "spec", "volumes"): "name",
    ("template", "spec", "initContainers"): "name",
    ("template", "spec", "containers"): "name",
    ("template", "spec", "imagePullSecrets"): "name",
    ("template", "spec", "containers", "[]", "env"): "name",
    ("template", "spec", "initContainers", "[]", "env"): "name",
    ("template", "spec", "containers", "[]", "volumeMounts"): "mountPath",
    ("template", "spec", "initContainers", "[]", "volumeMounts"): "mountPath",
}
_UNION: set[Path] = {
    ("resources", "tolerations"),
    ("template", "spec", "tolerations"),
    ("template", "spec", "containers", "[]", "envFrom"),
    ("template", "spec", "initContainers", "[]", "envFrom"),
}
_WHOLE: set[Path] = {("podSecurityContext",), ("resources", "network")}
# The fields a job's spec shares with the defaults; the others are the defaults' own.
JOB_FIELDS = (
    "image",
    "imagePullPolicy",
    "env",
    "priorityClassName",
    "activeDeadlineSeconds",
    "resources",
    "template",
)
# What the apiserver stores for a field the job left out (the CRD's defaults): a default fills
# such a field as it would an absent one.
_API_DEFAULTS: dict[Path, Any] = {("imagePullPolicy",): "IfNotPresent"}


def _merge(base: Any, top: Any, path: Path) -> Any:
    """`top` over `base` (both API-shaped); neither is modified."""
    if top is None:
        return copy.deepcopy(base)
    if base is None or path in _WHOLE:
        return copy.deepcopy(top)
    if isinstance(base, dict) and isinstance(top, dict):
        out = copy.deepcopy(base)
        for key, value in top.items():
            out[key] = _merge(base.get(key), value, (*path, str(key)))
        return out
    if isinstance(base, list) and isinstance(top, list):
        key = _KEYED.get(path)
        if key is not None:
            return _merge_keyed(base, top, key, path)
        if path in _UNION:
            return [*copy.deepcopy(base), *(copy.deepcopy(t) for t in top if t not in base)]
    return copy.deepcopy(top)


def _merge_keyed(base: list[Any], top: list[Any], key: str, path: Path) -> list[Any]:
    def name(entry: Any) -> Any:
        return entry.get(key) if isinstance(entry, dict) else None

    ours = {name(t) for t in top if name(t) is not None}
    theirs = {name(b): b for b in base if name(b) is not None}
    out = [copy.deepcopy(b) for b in base if name(b) is None or name(b) not in ours]
    for t in top:
        n = name(t)
        out.append(_merge(theirs[n], t, (*path, "[]")) if n in theirs else copy.deepcopy(t))
    return out


def _prune(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """`doc` without the maps left empty (an empty podSecurityContext means something: kept)."""
    out = {}
    for key, value in doc.items():
        here = (*path, key)
        kept = _prune(value, here) if isinstance(value, dict) and here not in _WHOLE else value
        if kept != {} or here in _WHOLE:
            out[key] = kept
    return out


@dataclass(frozen=True)
class Layer:
    """One source of defaults: `operator`, or `<namespace>/<name>` of a MegatronJobDefaults."""

    source: str
    spec: Mapping[str, Any]
    # The operator's own defaults (its --job-defaults, or such a file given to mjob), not a
    # namespace's MegatronJobDefaults: only these may name the launcher image.
    operator: bool = False


def resolve(layers: Sequence[Layer]) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """The record for status.defaults (`sources`, merged `spec`), or None when no layer sets
    anything; and the problems of layers that are not valid defaults (named by source)."""
    merged: dict[str, Any] = {}
    sources: list[str] = []
    errors: list[FieldError] = []
    for layer in layers[:MAX_SOURCES]:
        try:
            spec = MegatronJobDefaultsSpec.model_validate(dict(layer.spec))
        except ValidationError as exc:
            where = (
                "the operator's --job-defaults: "
                if layer.source == OPERATOR_SOURCE
                else f"{KIND} {layer.source}: spec."
            )
            errors += field_errors(exc, MegatronJobDefaultsSpec, where)
            continue
        # Only what the layer sets: an empty list or map the CRD filled in says nothing.
        api = _prune(spec.model_dump(by_alias=True, exclude_defaults=True, mode="json"), ())
        if "launcherImage" in api and not (layer.operator or layer.source == OPERATOR_SOURCE):
            # The code every trainer.command pod runs first: the operator's to choose.
            errors.append(
                FieldError(
                    f"{KIND} {layer.source}: spec.launcherImage",
                    "only the operator's own defaults (--job-defaults) may set the launcher "
                    "image: remove it",
                )
            )
            continue
        if api:
            merged = _merge(merged, api, ())
            sources.append(layer.source)
    if errors or not sources:
        return None, errors
    return {"sources": sources, "spec": merged}, []


def recorded_spec(record: Mapping[str, Any] | None) -> dict[str, Any]:
    """The merged defaults of a status.defaults record (empty when it holds none or garbage:
    the status is not the job's to write, but read defensively all the same)."""
    spec = record.get("spec") if isinstance(record, Mapping) else None
    return dict(spec) if isinstance(spec, Mapping) else {}


def _without_api_defaults(job_spec: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(job_spec)
    for (key,), value in _API_DEFAULTS.items():
        if out.get(key) == value:
            del out[key]
    resources = out.get("resources")
    if isinstance(resources, Mapping) and isinstance(resources.get("network"), Mapping):
        net = resources["network"]
        if net.get("fabric") in (None, "none") and net.get("resourceName") is None:
            out["resources"] = {k: v for k, v in resources.items() if k != "network"}
    return out


def apply(job_spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The job's spec merged over the defaults' job fields (the job wins every conflict). A
    field the job left at the API's default (imagePullPolicy IfNotPresent, fabric none) counts
    as unset."""
    under = {k: defaults[k] for k in JOB_FIELDS if k in defaults}
    if not under:
        return dict(job_spec)
    merged: dict[str, Any] = _merge(under, _without_api_defaults(job_spec), ())
    return merged


@dataclass(frozen=True)
class Platform:
    """What only defaults say about a job's objects (render.py)."""

    service_account_annotations: Mapping[str, str] = field(default_factory=dict)
    # runAsUser, runAsGroup and fsGroup of the pods; None in a field: left to the platform.
    run_as_user: int | None = DEFAULT_UID
    run_as_group: int | None = DEFAULT_UID
    fs_group: int | None = DEFAULT_UID
    launcher_image: str = DEFAULT_LAUNCHER_IMAGE  # a trainer.command's launcher init container


def platform(defaults: Mapping[str, Any]) -> Platform:
    """The Platform of merged defaults (already validated by `resolve`; anything unreadable,
    e.g. a hand-edited status, falls back to the built-in values)."""
    try:
        spec = MegatronJobDefaultsSpec.model_validate(dict(defaults))
    except ValidationError:
        return Platform()
    sa = spec.service_account.annotations if spec.service_account else {}
    ident = spec.pod_security_context
    launcher = spec.launcher_image or DEFAULT_LAUNCHER_IMAGE
    if ident is None:
        return Platform(service_account_annotations=dict(sa), launcher_image=launcher)
    return Platform(
        service_account_annotations=dict(sa),
        run_as_user=ident.run_as_user,
        run_as_group=ident.run_as_group,
        fs_group=ident.fs_group,
        launcher_image=launcher,
    )


def identity(user: int | None, group: int | None, fs_group: int | None) -> dict[str, Any]:
    """A podSecurityContext as the API writes it (for a file of defaults or the chart)."""
    return PodIdentity.model_validate(
        {"runAsUser": user, "runAsGroup": group, "fsGroup": fs_group}
    ).to_api()
