"""A small stand-in for the apiserver's CRD validation, for unit tests without a cluster.

It applies the generated schema's defaults (as the apiserver does on decode), coerces numbers to
the schema's types, then evaluates every `x-kubernetes-validations` rule with cel-python. The
integration tests apply the same cases to a real kube-apiserver; this catches mistakes earlier
and lets the rule table run in milliseconds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import celpy

from megatron_operator.api.base import quantity_value
from megatron_operator.api.crd import crd

_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _quantity(text: Any) -> Any:
    """Kubernetes CEL's quantity(): here the exact value, kept as a string."""
    return celpy.celtypes.StringType(str(quantity_value(str(text))))


def _compare_to(a: Any, b: Any) -> Any:
    x, y = Decimal(str(a)), Decimal(str(b))
    return celpy.celtypes.IntType((x > y) - (x < y))


# The Kubernetes CEL libraries our rules use that cel-python lacks.
_FUNCTIONS = {"quantity": _quantity, "compareTo": _compare_to}


def _program(expr: str) -> Any:
    if expr not in _PROGRAMS:
        _PROGRAMS[expr] = _ENV.program(_ENV.compile(expr), functions=_FUNCTIONS)
    return _PROGRAMS[expr]


def spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting and number coercion, as the apiserver does before validation."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for name, prop in schema["properties"].items():
            if name not in out and "default" in prop:
                out[name] = copy.deepcopy(prop["default"])
            if name in out:
                out[name] = apply_defaults(prop, out[name])
        return out
    if isinstance(value, dict) and "additionalProperties" in schema:
        return {k: apply_defaults(schema["additionalProperties"], v) for k, v in value.items()}
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


@dataclass(frozen=True)
class Violation:
    path: str  # where the rule sits, e.g. spec or spec.env[0]
    field_path: str  # the rule's fieldPath, e.g. .parallelism.tensor
    message: str

    @property
    def field(self) -> str:
        return self.path + self.field_path


def _evaluate(rule: dict[str, str], this: Any, old: Any | None) -> str | None:
    activation = {"self": celpy.json_to_cel(this)}
    if "oldSelf" in rule["rule"]:
        if old is None:
            return None  # transition rules only run on updates
        activation["oldSelf"] = celpy.json_to_cel(old)
    result = _program(rule["rule"]).evaluate(activation)
    if isinstance(result, Exception):
        raise AssertionError(f"CEL rule raised {result}: {rule['rule'][:200]}")
    if bool(result):
        return None
    if "messageExpression" in rule:
        message = _program(rule["messageExpression"]).evaluate(activation)
        if isinstance(message, Exception):
            raise AssertionError(f"CEL message raised {message}: {rule['messageExpression']}")
        return str(message)
    return rule.get("message", "")


def violations(
    schema: dict[str, Any], value: Any, old: Any | None = None, path: str = "spec"
) -> list[Violation]:
    """Every rule that fails on `value` (already defaulted), depth first."""
    out: list[Violation] = []
    for rule in schema.get("x-kubernetes-validations", []):
        message = _evaluate(rule, value, old)
        if message is not None:
            out.append(Violation(path, rule.get("fieldPath", ""), message))
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name in value:
                child_old = old.get(name) if isinstance(old, dict) else None
                out += violations(prop, value[name], child_old, f"{path}.{name}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += violations(schema["items"], item, None, f"{path}[{i}]")
    return out


def check_spec(spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[Violation]:
    schema = spec_schema()
    new = apply_defaults(schema, spec)
    prior = apply_defaults(schema, old) if old is not None else None
    return violations(schema, new, prior)
