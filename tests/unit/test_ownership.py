"""Whose is an existing object with a child's name (core/ownership.py): a table."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_operator.core.ownership import SEAL_ANNOTATION, claim_seal, conflict, sealed

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
        # our labels, no seal: trusted only by an operator without a key (tested below)
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
    problem = conflict(_child(kind), existing, JOB_UID)  # an operator without a claim key
    if ok:
        assert problem is None
    else:
        assert problem is not None
        assert problem.startswith(f"{kind} job-x already exists")
        assert "Delete or rename" in problem


KEY = b"k" * 32


def _claim(annotations: dict[str, str]) -> dict[str, Any]:
    existing = _existing(labels=OURS)
    existing["metadata"]["annotations"] = annotations
    return existing


def test_a_retained_claim_is_reused_only_with_its_seal() -> None:
    wanted = _child("PersistentVolumeClaim")
    made = sealed(wanted, KEY)  # what the operator created for the earlier job of this name
    seal = made["metadata"]["annotations"][SEAL_ANNOTATION]
    assert seal == claim_seal(KEY, "ns", "job", "job-x")
    assert conflict(wanted, _claim({SEAL_ANNOTATION: seal}), JOB_UID, KEY) is None
    # A planted claim: no seal, a forged one, one for another job or namespace, another key.
    for bad in (
        {},
        {SEAL_ANNOTATION: "0" * 64},
        {SEAL_ANNOTATION: claim_seal(KEY, "ns", "other", "job-x")},
        {SEAL_ANNOTATION: claim_seal(KEY, "other-ns", "job", "job-x")},
        {SEAL_ANNOTATION: claim_seal(b"x" * 32, "ns", "job", "job-x")},
    ):
        problem = conflict(wanted, _claim(bad), JOB_UID, KEY)
        assert problem is not None and "did not seal it" in problem, bad
    # With a key, labels alone are not enough (anyone who may create claims can set them).
    assert conflict(wanted, _existing(labels=OURS), JOB_UID, KEY) is not None
