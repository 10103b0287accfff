"""`spec.managedBy`: which controller runs a MegatronJob (as `batch/v1` Job's `managedBy`).

Unset or `megatron.dev/operator`: this operator. `kueue.x-k8s.io/multikueue`: Kueue's MultiKueue
dispatches the job to a worker cluster, copies it there without the field (so the worker's
operator runs it) and mirrors the worker's status back; on this cluster the operator only keeps
the job's Kueue Workload, as Kueue's external-framework protocol asks of it. Any other value:
another controller; the operator leaves the job alone. Immutable (a CEL transition rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

OPERATOR: Final = "megatron.dev/operator"
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
MAX_LENGTH: Final = 63
# A domain-prefixed path, as apimachinery's IsDomainPrefixedPath: a DNS subdomain, '/', a path.
PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$"
)


class Manager(StrEnum):
    """Who runs a job, from this operator's point of view."""

    OPERATOR = "Operator"  # we do: children, pods, status
    MULTIKUEUE = "MultiKueue"  # a worker cluster does; here only the Workload is ours
    OTHER = "Other"  # someone else does; we touch nothing


def manager_of(value: str | None) -> Manager:
    if value is None or value == OPERATOR:
        return Manager.OPERATOR
    if value == MULTIKUEUE:
        return Manager.MULTIKUEUE
    return Manager.OTHER


def manager_of_job(job: Mapping[str, Any]) -> Manager:
    """The same, read defensively from a raw job (a malformed spec counts as ours: the state
    machine then reports it)."""
    spec = job.get("spec")
    value = spec.get("managedBy") if isinstance(spec, Mapping) else None
    return manager_of(value if isinstance(value, str) else None)
