"""Deterministic names, labels and annotations of a job's children (one place, no randomness).

Pods keep the same name across restart attempts (`<job>-<node rank>`), as JobSet's child Jobs do:
the hostname, the DNS name behind MASTER_ADDR and the trainer's RBAC resourceNames stay stable,
and an attempt is told apart by the `megatron.dev/restart-attempt` label.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "megatron.dev"
LABEL_JOB_NAME: Final = f"{DOMAIN}/job-name"
LABEL_JOB_UID: Final = f"{DOMAIN}/job-uid"
LABEL_RESTART_ATTEMPT: Final = f"{DOMAIN}/restart-attempt"
LABEL_NODE_RANK: Final = f"{DOMAIN}/node-rank"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "megatron-operator"
ANNOTATION_LAYOUT: Final = f"{DOMAIN}/layout"
FINALIZER: Final = f"{DOMAIN}/cleanup"

CONTAINER_NAME: Final = "trainer"
SPEC_KEY: Final = "spec.json"  # in the ConfigMap: the spec the current attempt runs


def pod_name(job: str, node_rank: int) -> str:
    return f"{job}-{node_rank}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-config"


def pvc_name(job: str) -> str:
    return f"{job}-checkpoints"


def trainer_account_name(job: str) -> str:
    """Name of the trainer's ServiceAccount, and of its Role and RoleBinding."""
    return f"{job}-trainer"


def progress_lease_name(job: str) -> str:
    """The Lease rank 0 writes its progress record to; the trainer's Role names only it."""
    return f"{job}-progress"


def master_addr(job: str, namespace: str) -> str:
    """Stable DNS name of node 0's pod through the headless Service."""
    return f"{pod_name(job, 0)}.{service_name(job)}.{namespace}.svc"
