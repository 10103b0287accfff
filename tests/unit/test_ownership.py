"""Whose is an existing object with a child's name (core/ownership.py): a table."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_operator.core.ownership import conflict

JOB_UID = "uid-1"


def _child(kind: str, name: str = "job-x") -> dict[str, Any]:
    labels = {"megatron.dev/job-name": "job", "app.kubernetes.io/managed-by": "megatron-operator"}
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "labels": labels}}


def _existing(
    owner_uid: str | None = None,
    controller: bool = True,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "job-x", "labels": labels or {}}
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {"kind": "MegatronJob", "name": "job", "uid": owner_uid, "controller": controller}
        ]
    return {"metadata": meta}


OURS = {"megatron.dev/job-name": "job", "app.kubernetes.io/managed-by": "megatron-operator"}


@pytest.mark.parametrize(
    ("kind", "existing", "ok"),
    [
        ("ConfigMap", _existing(JOB_UID), True),
        ("ConfigMap", _existing(), False),  # made by hand
        ("ConfigMap", _existing("old-job-uid"), False),  # an earlier job of this name
        ("ConfigMap", _existing(JOB_UID, controller=False), False),  # owner, not controller
        ("ConfigMap", _existing(labels=OURS), False),  # our labels alone prove nothing
        ("ServiceAccount", _existing(), False),  # never reused: user code would get its rights
        ("Role", _existing("other"), False),
        ("RoleBinding", _existing(), False),
        ("Service", _existing(), False),
        ("NetworkPolicy", _existing(), False),
        ("Pod", _existing("other"), False),
        ("Pod", _existing(JOB_UID), True),
        # a retained checkpoint claim of a job of this name: resume from it
        ("PersistentVolumeClaim", _existing(labels=OURS), True),
        ("PersistentVolumeClaim", _existing(JOB_UID), True),
        ("PersistentVolumeClaim", _existing(), False),  # someone's claim
        ("PersistentVolumeClaim", _existing("other", labels=OURS), False),  # someone controls it
        (
            "PersistentVolumeClaim",
            _existing(labels={**OURS, "megatron.dev/job-name": "other"}),
            False,
        ),
    ],
)
def test_conflict(kind: str, existing: dict[str, Any], ok: bool) -> None:
    problem = conflict(_child(kind), existing, JOB_UID)
    if ok:
        assert problem is None
    else:
        assert problem is not None
        assert problem.startswith(f"{kind} job-x already exists")
        assert "Delete or rename" in problem
