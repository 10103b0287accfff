"""`spec.template` laid over a rendered pod (pure), as a strategic merge patch of a PodSpec would.

Lists keyed by name are merged by name (the template's entry replaces one of the same name, or is
added): volumes, containers, initContainers, imagePullSecrets, and the trainer's env. Maps are
merged key by key, the template's value winning (labels, annotations, nodeSelector, the pod's
securityContext, the trainer's resource entries). Affinity terms and tolerations are added to the
operator's, never replace them: one pod per node and the topology packing always hold. The API
refuses every field the operator owns before a template gets here (api/template.py), so nothing
merged below can undo the gang's contract.
"""

from __future__ import annotations

from typing import Any

from megatron_contract.paths import CONTAINER_NAME
from megatron_operator.api.template import PodTemplate

Obj = dict[str, Any]


def _merge_by(key: str, ours: list[Obj], theirs: list[Obj]) -> list[Obj]:
    out = [dict(o) for o in ours]
    index = {o.get(key): i for i, o in enumerate(out)}
    for item in theirs:
        if item.get(key) in index:
            out[index[item[key]]] = item
        else:
            index[item.get(key)] = len(out)
            out.append(item)
    return out


def _json_copy(value: Any) -> Any:
    """A copy of JSON data: faster than copy.deepcopy, which a 1,024-pod gang would feel."""
    if isinstance(value, dict):
        return {k: _json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_copy(v) for v in value]
    return value


def _affinity(ours: Obj, theirs: Obj) -> Obj:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in ours.items()}
    for kind, terms in theirs.items():
        if kind in ("podAffinity", "podAntiAffinity") and isinstance(terms, dict):
            mine = out.setdefault(kind, {})
            for when, items in terms.items():
                if isinstance(items, list):
                    mine[when] = [*mine.get(when, []), *items]
                else:
                    mine[when] = items
        else:
            out[kind] = terms
    return out


def _trainer(container: Obj, patch: Obj) -> Obj:
    out = dict(container)
    if "env" in patch:
        out["env"] = _merge_by("name", out.get("env", []), patch["env"])
    if "envFrom" in patch:
        out["envFrom"] = [*out.get("envFrom", []), *patch["envFrom"]]
    if "volumeMounts" in patch:
        out["volumeMounts"] = _merge_by(
            "mountPath", out.get("volumeMounts", []), patch["volumeMounts"]
        )
    if "resources" in patch:
        resources = {k: dict(v) for k, v in out.get("resources", {}).items()}
        for kind, entries in patch["resources"].items():
            if isinstance(entries, dict):
                resources[kind] = {**resources.get(kind, {}), **entries}
            else:
                resources[kind] = entries
        out["resources"] = resources
    return out


# The template's JSON, by template object: a gang of 1,024 pods dumps its job's template once,
# not once per pod. The object is kept beside its dump, so a reused id() cannot match.
_DUMPS: dict[int, tuple[PodTemplate, Obj]] = {}
_DUMPS_MAX = 64


def _dump(template: PodTemplate) -> Obj:
    hit = _DUMPS.get(id(template))
    if hit is not None and hit[0] is template:
        return hit[1]
    if len(_DUMPS) >= _DUMPS_MAX:
        _DUMPS.clear()
    doc = template.to_api()
    _DUMPS[id(template)] = (template, doc)
    return doc


def overlay(pod: Obj, template: PodTemplate | None) -> Obj:
    """The pod with the template merged in (in place: the renderer made it for this call).
    What comes from the template is copied, so no two pods share a dict."""
    if template is None:
        return pod
    doc: Obj = _json_copy(_dump(template))
    out = pod
    meta, spec = out["metadata"], out["spec"]
    extra = doc.get("metadata", {})
    for key in ("labels", "annotations"):
        if key in extra:
            meta[key] = {**extra[key], **meta.get(key, {})}  # ours win (theirs are refused)
    patch = doc.get("spec", {})
    containers = spec["containers"]
    for c in patch.get("containers", []):
        if c["name"] == CONTAINER_NAME:
            containers[0] = _trainer(containers[0], c)
        else:
            containers.append(c)
    for key in ("volumes", "initContainers", "imagePullSecrets"):
        if key in patch:
            spec[key] = _merge_by("name", spec.get(key, []), patch[key])
    for key in ("nodeSelector", "securityContext"):
        if key in patch:
            spec[key] = {**spec.get(key, {}), **patch[key]}
    if "affinity" in patch:
        spec["affinity"] = _affinity(spec.get("affinity", {}), patch["affinity"])
    if "tolerations" in patch:
        spec["tolerations"] = [*spec.get("tolerations", []), *patch["tolerations"]]
    for key in ("schedulerName", "runtimeClassName", "dnsConfig"):
        if key in patch:
            spec[key] = patch[key]
    return out
