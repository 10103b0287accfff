"""Generate the MegatronJob CustomResourceDefinition from the pydantic models.

The models are the single source of truth: `crds/megatronjobs.megatron.dev.yaml`, the chart's copy
and `docs/api.md` are generated from here (`python -m megatron_operator.api.gen`), and a test fails
when any of them is stale. Pydantic's JSON Schema is turned into a structural OpenAPI v3 schema:
references inlined, nullable unions collapsed, descriptions kept, CEL rules attached.
"""

from __future__ import annotations

import copy
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel

from . import defaults
from .cel import NODE_RULES, SPEC_RULES, TEMPLATE_RULES, TRANSITION_RULES, TYPE_RULES
from .job import (
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from .spec import MegatronJobSpec
from .status import MegatronJobStatus

_DROP = {"title", "additionalProperties", "$defs", "discriminator"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **extra}, defs)
    return {k: _resolve(v, defs) for k, v in node.items()}


def _openapi(node: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-Schema node → a structural OpenAPI v3 node."""
    node = dict(node)
    if "patternProperties" in node:
        # Pydantic emits these for dict keys with a pattern; a structural schema would drop them
        # (and the map's values with them). Check such keys with a CEL rule instead.
        raise ValueError(f"patternProperties are not structural: {node}")
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        options = [o for o in any_of if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unions other than X | None are not structural: {any_of}")
        inner = options[0]
        node = {**inner, **{k: v for k, v in node.items() if k not in ("default",)}}
        if node.get("default") is None:
            node.pop("default", None)
    out: dict[str, Any] = {}
    if "description" in node:
        out["description"] = node["description"]
    if node.get("x-kubernetes-int-or-string"):
        out["x-kubernetes-int-or-string"] = True
        for key in ("pattern", "minimum", "maximum"):  # each applies to its own kind only
            if key in node:
                out[key] = node[key]
        if "default" in node:
            out["default"] = node["default"]
        return out
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    kind = node.get("type")
    if kind is not None:
        out["type"] = kind
    for key in (
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    ):
        if key in node:
            out[key] = node[key]
    for key, base in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if key in node:
            out[base] = node[key]
            out[key] = True
    if "default" in node and node["default"] is not None:
        out["default"] = node["default"]
    for key in ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type"):
        if key in node:
            out[key] = node[key]
    if "x-kubernetes-list-map-keys" in node:
        out["x-kubernetes-list-map-keys"] = node["x-kubernetes-list-map-keys"]
    if kind == "object":
        if "properties" in node:
            required = node.get("required", [])
            props = {}
            for name, raw in node["properties"].items():
                prop = _openapi(raw)
                if _defaults_to_empty_object(name, raw, prop, required):
                    # A default_factory object: `{}` lets the apiserver fill in its fields.
                    prop["default"] = {}
                props[name] = prop
            out["properties"] = props
            if required:
                out["required"] = list(required)
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = _openapi(node["additionalProperties"])
    if kind == "array":
        out["items"] = _openapi(node["items"])
    return out


def _defaults_to_empty_object(
    name: str, raw: dict[str, Any], prop: dict[str, Any], required: list[str]
) -> bool:
    nullable = any(o.get("type") == "null" for o in raw.get("anyOf", []))
    return (
        name not in required
        and not nullable
        and prop.get("type") == "object"
        and "properties" in prop
        and "required" not in prop
        and "default" not in prop
    )


def _attach(schema: dict[str, Any], path: str, rules: list[dict[str, str]]) -> None:
    node = schema
    for part in path.split("."):
        is_item = part.endswith("[]")
        node = node["properties"][part.removesuffix("[]")]
        if is_item:
            node = node["items"]
    node.setdefault("x-kubernetes-validations", []).extend(rules)


def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    resolved = _resolve(raw, raw.get("$defs", {}))
    return _openapi(
        {k: v for k, v in resolved.items() if k not in _DROP or k == "additionalProperties"}
    )


def _models_in(annotation: Any) -> Iterator[tuple[type[BaseModel], bool]]:
    """The models an annotation holds, each with whether it is a list's item."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, False
    elif origin is list:
        for model, _ in _models_in(typing.get_args(annotation)[0]):
            yield model, True
    elif origin in (typing.Union, types.UnionType, typing.Annotated):
        args = typing.get_args(annotation)
        for arg in args[:1] if origin is typing.Annotated else args:
            yield from _models_in(arg)


def model_paths(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """(schema path, model) for every model nested in `model`, in _attach's path form."""
    for name, info in model.model_fields.items():
        key = info.alias or name
        for inner, is_item in _models_in(info.annotation):
            path = f"{prefix}.{key}" + ("[]" if is_item else "")
            yield path, inner
            yield from model_paths(inner, path)


def spec_schema() -> dict[str, Any]:
    spec = _model_schema(MegatronJobSpec)
    spec["x-kubernetes-validations"] = [*SPEC_RULES, *TRANSITION_RULES]
    root = {"properties": {"spec": spec}}
    for path, rules in {**NODE_RULES, **TEMPLATE_RULES}.items():
        _attach(root, path, rules)
    for path, model in model_paths(MegatronJobSpec, "spec"):
        if model in TYPE_RULES:
            _attach(root, path, TYPE_RULES[model])
    return spec


def defaults_spec_schema() -> dict[str, Any]:
    """A MegatronJobDefaults spec: the job's own rules on every field they share (the env names,
    node selector keys and template fields the operator owns)."""
    spec = _model_schema(defaults.MegatronJobDefaultsSpec)
    root = {"properties": {"spec": spec}}
    for path, rules in {**NODE_RULES, **TEMPLATE_RULES}.items():
        try:
            _attach(root, path, rules)
        except KeyError:
            continue  # a job field the defaults do not have
    return spec


def status_schema() -> dict[str, Any]:
    return _model_schema(MegatronJobStatus)


def _strip_defaults(node: Any) -> Any:
    # The status is written whole by the operator; defaults there would only mask bugs.
    if isinstance(node, dict):
        return {k: _strip_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_strip_defaults(v) for v in node]
    return node


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Layout", "type": "string", "jsonPath": ".status.layout"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progressSummary"},
    {"name": "Goodput", "type": "string", "jsonPath": ".status.ledger.summary"},
    {"name": "ETA", "type": "string", "jsonPath": ".status.forecast.summary"},
    {"name": "Queue", "type": "string", "jsonPath": ".status.localQueue"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    root = {
        "type": "object",
        "description": "A Megatron-Core training job: a model, a parallel layout, nodes and GPUs, "
        "and a checkpoint volume. The operator runs one pod per node and restarts them together.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "megatron.dev/v1alpha1"},
            "kind": {"type": "string", "description": "MegatronJob"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": _strip_defaults(status_schema()),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
                "message": "metadata.name must be a DNS label (lowercase letters, digits and '-', "
                "starting with a letter): pod hostnames are built from it",
                "reason": "FieldValueInvalid",
            },
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                "(pod hostnames append the node rank)",
                "reason": "FieldValueInvalid",
            },
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "megatron-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["megatron"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def defaults_crd() -> dict[str, Any]:
    """The MegatronJobDefaults CustomResourceDefinition (api/defaults.py)."""
    root = {
        "type": "object",
        "description": "Defaults every MegatronJob in this namespace inherits, under its own "
        "spec: trainer image, env, requests, node selector, tolerations, fabric, pod "
        "conventions, pod identity and the trainer ServiceAccount's annotations.",
        "properties": {
            "apiVersion": {"type": "string", "description": "megatron.dev/v1alpha1"},
            "kind": {"type": "string", "description": defaults.KIND},
            "metadata": {"type": "object"},
            "spec": defaults_spec_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{defaults.PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "megatron-operator"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": defaults.KIND,
                "listKind": f"{defaults.KIND}List",
                "plural": defaults.PLURAL,
                "singular": defaults.SINGULAR,
                "shortNames": list(defaults.SHORT_NAMES),
                "categories": ["megatron"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": [
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
