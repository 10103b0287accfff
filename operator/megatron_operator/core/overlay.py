"""`spec.template` laid over a rendered pod (pure), as a strategic merge patch of a PodSpec would.

Lists keyed by name are merged by name (the template's entry replaces one of the same name, or is
added): volumes, containers, initContainers, imagePullSecrets, and the trainer's env. Maps are
merged key by key, the template's value winning (labels, annotations, nodeSelector, the pod's
securityContext, the trainer's resource entries). Affinity terms and tolerations are added to the
operator's, never replace them: one pod per node and the topology packing always hold. The API
refuses every field the operator owns before a template gets here (api/template.py), so nothing
merged below can undo the gang's contract.

The template's parts are shared, not copied: every pod of a gang holds the same dicts for the
template's volumes, sidecars, affinity terms and DNS options (what the operator merges in is new
per pod). A rendered pod is therefore read-only below its own top-level fields; nothing that
takes it (the Kueue admission patch, the create call, `mjob render`) writes into it. A template
holds at most 64 KiB (api/template.py), and a 1,024-pod gang costs it once, not 1,024 times.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Final

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


def _hardened(container: Obj) -> Obj:
    """An init or sidecar container held to restricted: no privilege escalation and every
    capability dropped, unless the template says so itself (the API refuses the opposite:
    escalation, privilege, root, added capabilities beyond NET_BIND_SERVICE and IPC_LOCK)."""
    context = dict(container.get("securityContext") or {})
    context.setdefault("allowPrivilegeEscalation", False)
    caps = dict(context.get("capabilities") or {})
    drop = list(caps.get("drop") or [])
    if "ALL" not in drop:
        drop.append("ALL")
    caps["drop"] = drop
    context["capabilities"] = caps
    return {**container, "securityContext": context}


def prepared(template: PodTemplate) -> Obj:
    """The template as the pods carry it: its JSON, with its init and sidecar containers held to
    restricted. Shared by every pod rendered from it (cached by template object)."""
    hit = _PREPARED.get(id(template))
    if hit is not None and hit[0] is template:
        _PREPARED.move_to_end(id(template))
        return hit[1]
    doc = template.to_api()
    spec = doc.get("spec", {})
    for key in ("initContainers", "containers"):
        if key in spec:
            spec[key] = [c if c["name"] == CONTAINER_NAME else _hardened(c) for c in spec[key]]
    size = len(json.dumps(doc, separators=(",", ":")))
    _remember(template, doc, size)
    return doc


# The prepared templates, by template object: a gang of 1,024 pods prepares its job's template
# once, not once per pod. The object is kept beside its doc, so a reused id() cannot match. The
# cache is bounded in bytes (of JSON; the Python objects take about ten times that) as well as in
# entries, and a template over a quarter of the budget is not kept at all.
CACHE_ENTRIES: Final = 32
CACHE_BYTES: Final = 1024 * 1024
_PREPARED: OrderedDict[int, tuple[PodTemplate, Obj, int]] = OrderedDict()


def _remember(template: PodTemplate, doc: Obj, size: int) -> None:
    if size * 4 > CACHE_BYTES:
        return
    _PREPARED[id(template)] = (template, doc, size)
    total = sum(entry[2] for entry in _PREPARED.values())
    while len(_PREPARED) > CACHE_ENTRIES or total > CACHE_BYTES:
        _, (_, _, dropped) = _PREPARED.popitem(last=False)
        total -= dropped


def cached_bytes() -> int:
    """The JSON bytes of the prepared templates the cache holds (for tests and benchmarks)."""
    return sum(entry[2] for entry in _PREPARED.values())


def overlay(pod: Obj, template: PodTemplate | None, doc: Obj | None = None) -> Obj:
    """The pod with the template merged in (in place: the renderer made it for this call).
    The template's parts are shared with every other pod rendered from it: read-only. `doc` is
    `prepared(template)` when the caller already has it."""
    if template is None:
        return pod
    if doc is None:
        doc = prepared(template)
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
