"""spec.template's Kubernetes objects against Kubernetes' own API schema (1.34): every field we
declare exists there with the same type, and below the pod's own fields we declare every field
Kubernetes has (a field left out would be pruned by the apiserver without a word). Also: no part
of the spec is kept whole, so the CRD bounds every list, map and string."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate

from megatron_operator.api.crd import crd

K8S_VERSION = "1.34.0"
# Where we declare a subset on purpose, and why.
SUBSETS = {
    "template.metadata": "labels and annotations only",
    "template.spec": "the pod fields a template may set",
    "template.spec.initContainers[]": "restartPolicyRules (alpha) not offered",
    "template.spec.containers[]": "restartPolicyRules (alpha) not offered",
    "template.spec.volumes[].ephemeral.volumeClaimTemplate.metadata": "labels and annotations",
    "template.spec.initContainers[].env[].valueFrom": "fileKeyRef (alpha EnvFiles) not offered",
    "template.spec.containers[].env[].valueFrom": "fileKeyRef (alpha EnvFiles) not offered",
}


def _definitions() -> dict[str, Any]:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    doc = json.loads((base / f"v{K8S_VERSION}-local-strict" / "_definitions.json").read_text())
    defs: dict[str, Any] = doc["$defs"]
    return defs


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node or "allOf" in node:
        ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
        node = defs[ref.rsplit("/", 1)[-1]]
    return node


def _kind(node: dict[str, Any]) -> str:
    kind = node.get("type", "")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if node.get("x-kubernetes-int-or-string") or node.get("format") == "int-or-string":
        return "int-or-string"
    return str(kind)


def _compare(ours: dict[str, Any], theirs: dict[str, Any], path: str, defs: dict[str, Any],
             problems: list[str]) -> None:  # fmt: skip
    theirs = _resolve(theirs, defs)
    kinds = {"int-or-string"} if "oneOf" in theirs else {_kind(theirs)}  # IntOrString, Quantity
    if _kind(ours) not in kinds and not (_kind(ours) == "int-or-string" and kinds == {""}):
        problems.append(f"{path}: type {_kind(ours)}, Kubernetes has {kinds}")
        return
    if "enum" in ours and "enum" in theirs:
        extra = set(ours["enum"]) - set(theirs["enum"])
        if extra:
            problems.append(f"{path}: values {sorted(extra)} are not Kubernetes'")
    if "properties" in ours:
        mine, upstream = set(ours["properties"]), set(theirs.get("properties", {}))
        if mine - upstream:
            problems.append(f"{path}: fields {sorted(mine - upstream)} are not Kubernetes'")
        if path not in SUBSETS and upstream - mine:
            problems.append(f"{path}: Kubernetes' fields {sorted(upstream - mine)} are missing")
        for name in mine & upstream:
            _compare(ours["properties"][name], theirs["properties"][name], f"{path}.{name}", defs,
                     problems)  # fmt: skip
    elif "items" in ours:
        _compare(ours["items"], theirs["items"], f"{path}[]", defs, problems)
    elif isinstance(ours.get("additionalProperties"), dict):
        _compare(ours["additionalProperties"], theirs["additionalProperties"], f"{path}.*", defs,
                 problems)  # fmt: skip


def _spec() -> dict[str, Any]:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec: dict[str, Any] = root["properties"]["spec"]
    return spec


def test_the_template_matches_the_kubernetes_pod_template() -> None:
    defs = _definitions()
    problems: list[str] = []
    template = _spec()["properties"]["template"]
    _compare(template, defs["io.k8s.api.core.v1.PodTemplateSpec"], "template", defs, problems)
    assert problems == []


def _kept(node: dict[str, Any], path: str, out: list[str]) -> None:
    if node.get("x-kubernetes-preserve-unknown-fields"):
        out.append(path)
    kind = node.get("type")
    if kind == "array" and "maxItems" not in node:
        out.append(f"{path} (no maxItems)")
    if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
        out.append(f"{path} (no maxProperties)")
    for name, prop in node.get("properties", {}).items():
        _kept(prop, f"{path}.{name}", out)
    if "items" in node:
        _kept(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _kept(node["additionalProperties"], f"{path}.*", out)


def test_no_part_of_the_spec_is_unbounded() -> None:
    found: list[str] = []
    _kept(_spec(), "spec", found)
    assert found == []
