"""Whose is an object that already has one of a job's child names? (pure)

A namespace is shared by its users, so a ConfigMap `<job>-config`, a ServiceAccount
`<job>-trainer` or a pod may exist before the job does: made by someone else, by hand, or by an
earlier job of the same name. The operator modifies, adopts or deletes only objects whose
controller ownerReference names this job's uid. Anything else is a conflict: the job is told
which object and what to do, and nothing of it is created. A pre-existing ServiceAccount in
particular is never reused, since user code would run with its rights.

The one exception is a checkpoint claim the operator created and retained
(`checkpoint.volume.create.retentionPolicy.whenDeleted: Retain`): it has no ownerReference by
design, so a job re-created with the same name resumes from it. Labels prove nothing (anyone who
may create claims in the namespace can set them, and a planted claim's checkpoints would run as
the new job's code), so the operator seals the claims it creates: an annotation holding an HMAC
of the namespace, the job's name and the claim's name under a key only the operator holds
(`mjob operator --claim-key-file`; the chart always gives one). A retained claim is then reused
only when its seal checks out. An operator run without a key trusts the labels, as before seals
existed, and says so when it starts.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final

from megatron_operator.core.names import LABEL_JOB_NAME, LABEL_MANAGED_BY, MANAGED_BY
from megatron_operator.core.observe import controller_uid

# Kinds the operator updates when they exist and are its own: a new attempt may run a changed
# spec (the trainer config) or new pod names (the Role's resourceNames).
UPDATED_KINDS = frozenset({"ConfigMap", "Role"})
SEAL_ANNOTATION: Final = "megatron.dev/claim-seal"


def claim_seal(key: bytes, namespace: str, job: str, claim: str) -> str:
    """The seal of a claim the operator creates for `job` (HMAC-SHA256, hex)."""
    message = f"megatron.dev/claim\0{namespace}\0{job}\0{claim}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sealed(claim: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """`claim` (a rendered PersistentVolumeClaim without a controller) with its seal added."""
    meta = dict(claim.get("metadata") or {})
    job = str((meta.get("labels") or {}).get(LABEL_JOB_NAME, ""))
    seal = claim_seal(key, str(meta.get("namespace")), job, str(meta.get("name")))
    meta["annotations"] = {**(meta.get("annotations") or {}), SEAL_ANNOTATION: seal}
    return {**claim, "metadata": meta}


def _controller(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"controlled by {ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})"
    return "with no controller"


def retained_claim(
    kind: str, meta: Mapping[str, Any], job: str, namespace: str, key: bytes | None
) -> bool:
    """A checkpoint claim the operator made for a job of this name: its seal checks out (or,
    without a key, its labels say so)."""
    labels = meta.get("labels") or {}
    if (
        kind != "PersistentVolumeClaim"
        or controller_uid(dict(meta)) is not None
        or labels.get(LABEL_JOB_NAME) != job
        or labels.get(LABEL_MANAGED_BY) != MANAGED_BY
    ):
        return False
    if key is None:
        return True
    seal = (meta.get("annotations") or {}).get(SEAL_ANNOTATION)
    expected = claim_seal(key, namespace, job, str(meta.get("name")))
    return isinstance(seal, str) and hmac.compare_digest(seal, expected)


def conflict(
    wanted: Mapping[str, Any],
    existing: Mapping[str, Any],
    job_uid: str | None,
    key: bytes | None = None,
) -> str | None:
    """None when `existing` (found under the name of the child `wanted`) is the job's own, or
    a retained claim of its name sealed with `key`; otherwise what is wrong and what to do, for
    the condition."""
    meta: Mapping[str, Any] = existing.get("metadata") or {}
    kind = str(wanted.get("kind"))
    wanted_meta: Mapping[str, Any] = wanted.get("metadata") or {}
    name = str(wanted_meta.get("name"))
    job = str((wanted_meta.get("labels") or {}).get(LABEL_JOB_NAME, ""))
    if job_uid is None or controller_uid(dict(meta)) == job_uid:
        return None
    namespace = str(wanted_meta.get("namespace"))
    if retained_claim(kind, meta, job, namespace, key):
        return None
    if kind == "PersistentVolumeClaim" and controller_uid(dict(meta)) is None:
        return (
            f"PersistentVolumeClaim {name} already exists with no controller, and the operator "
            "did not seal it for a job of this name: it is not reused, since its checkpoints "
            "would run as this job's code. If you trust it, "
            f"name it in spec.checkpoint.volume.claimName. Delete or rename it otherwise"
        )
    return (
        f"{kind} {name} already exists, {_controller(meta)}, and is not this job's: the operator "
        "does not modify, adopt or delete it, and the job does not start. Delete or rename that "
        f"{kind}, or re-create the job under another name"
    )
