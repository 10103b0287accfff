"""Builders for spec documents used across the unit tests."""

from __future__ import annotations

import copy
from typing import Any

from megatron_operator.api import MegatronJob, load_job

DELETE = object()

# A small GPU job: gpt-tiny on 2 nodes × 8 GPUs (world 16). Each table case changes a few
# fields of it to break exactly one rule.
BASE_SPEC: dict[str, Any] = {
    "image": "trainer:test",
    "model": {"recipe": "gpt-tiny"},
    "training": {"globalBatchSize": 64, "trainIters": 100},
    "data": {"mock": True},
    "resources": {"nodes": 2, "procsPerNode": 8},
    "checkpoint": {"volume": {"claimName": "ckpt"}},
}


def with_changes(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A copy of `spec` with dotted paths set (or removed, with DELETE)."""
    out = copy.deepcopy(spec)
    for path, value in changes.items():
        node = out
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = copy.deepcopy(value)
    return out


def spec_of(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return with_changes(BASE_SPEC, changes or {})


def job_doc(spec: dict[str, Any], name: str = "job", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "MegatronJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def job_of(changes: dict[str, Any] | None = None, **meta: Any) -> MegatronJob:
    return load_job(job_doc(spec_of(changes), **meta))
