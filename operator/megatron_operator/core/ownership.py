"""Whose is an object that already has one of a job's child names? (pure)

A namespace is shared by its users, so a ConfigMap `<job>-config`, a ServiceAccount
`<job>-trainer` or a pod may exist before the job does: made by someone else, by hand, or by an
earlier job of the same name. The operator modifies, adopts or deletes only objects whose
controller ownerReference names this job's uid. Anything else is a conflict: the job is told
which object and what to do, and nothing of it is created. A pre-existing ServiceAccount in
particular is never reused, since user code would run with its rights.

The one exception is a checkpoint claim the operator created and retained
(`checkpoint.volume.create.retentionPolicy.whenDeleted: Retain`): it has no ownerReference by
design and carries the job's name label, so a job re-created with the same name resumes from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from megatron_operator.core.names import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY
from megatron_operator.core.observe import controller_uid

# Kinds the operator updates when they exist and are its own: a new attempt may run a changed
# spec (the trainer config) or new pod names (the Role's resourceNames).
UPDATED_KINDS = frozenset({"ConfigMap", "Role"})


def _controller(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"controlled by {ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})"
    return "with no controller"


def retained_claim(kind: str, meta: Mapping[str, Any], job: str) -> bool:
    """A checkpoint claim retained from an earlier job of this name."""
    labels = meta.get("labels") or {}
    return (
        kind == "PersistentVolumeClaim"
        and controller_uid(dict(meta)) is None
        and labels.get(LABEL_JOB_NAME) == job
        and labels.get(LABEL_MANAGED_BY) == MANAGED_BY
    )


def conflict(
    wanted: Mapping[str, Any], existing: Mapping[str, Any], job_uid: str | None
) -> str | None:
    """None when `existing` (found under the name of the child `wanted`) is the job's own, or
    a retained claim of its name; otherwise what is wrong and what to do, for the condition."""
    meta: Mapping[str, Any] = existing.get("metadata") or {}
    kind = str(wanted.get("kind"))
    wanted_meta: Mapping[str, Any] = wanted.get("metadata") or {}
    name = str(wanted_meta.get("name"))
    job = str((wanted_meta.get("labels") or {}).get(LABEL_JOB_NAME, ""))
    if job_uid is None or controller_uid(dict(meta)) == job_uid:
        return None
    if retained_claim(kind, meta, job):
        return None
    return (
        f"{kind} {name} already exists, {_controller(meta)}, and is not this job's: the operator "
        "does not modify, adopt or delete it, and the job does not start. Delete or rename that "
        f"{kind}, or re-create the job under another name"
    )
