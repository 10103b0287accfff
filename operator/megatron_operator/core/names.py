"""Deterministic names, labels and annotations of a job's children (one place, no randomness).

Each restart attempt's pods are distinct objects (`<job>-a<attempt>-<node rank>`), so a late
delete of attempt N can never hit attempt N+1's pod of the same rank (deletes also carry the pod's
uid as a precondition). The pod's `spec.hostname` is the stable `<job>-<node rank>` and its
`spec.subdomain` the headless Service, so the DNS name behind MASTER_ADDR is the same on every
attempt. The Service selects node rank 0 only: no other rank is dialled by name.
"""

from __future__ import annotations

from typing import Final

from megatron_contract import paths

DOMAIN: Final = "megatron.dev"
LABEL_JOB_NAME: Final = f"{DOMAIN}/job-name"
LABEL_JOB_UID: Final = f"{DOMAIN}/job-uid"
LABEL_RESTART_ATTEMPT: Final = f"{DOMAIN}/restart-attempt"
# A gang pod's node rank; a spare pod's index among the job's pods (nodes + its spare number), so
# that Kueue's topology-aware scheduling (podIndexLabel) places the spares beside the gang.
LABEL_NODE_RANK: Final = f"{DOMAIN}/node-rank"
LABEL_SPARE: Final = f"{DOMAIN}/spare"  # a spare pod's number (0 .. spareNodes-1)
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "megatron-operator"
ANNOTATION_LAYOUT: Final = f"{DOMAIN}/layout"
# How the pod's launcher handles a failed rank (spec.restartPolicy.strategy when it was created):
# only a gang whose every pod says InPlace can restart in place.
ANNOTATION_RESTART_STRATEGY: Final = f"{DOMAIN}/restart-strategy"
FINALIZER: Final = f"{DOMAIN}/cleanup"

# The node whose pod hosts the rendezvous store: MASTER_ADDR names it, and the headless Service
# selects it alone.
MASTER_NODE_RANK: Final = 0

CONTAINER_NAME: Final = paths.CONTAINER_NAME
SPEC_KEY: Final = "spec.json"  # in the ConfigMap: the spec the current attempt runs


def pod_name(job: str, node_rank: int, attempt: int) -> str:
    """A pod of one attempt. At most 50 (job) + 2 + attempt digits + 1 + 4 (ranks < 4096)
    characters: far below the 253 a pod name may have; the hostname below is the DNS label."""
    return f"{job}-a{attempt}-{node_rank}"


def spare_pod_name(job: str, spare: int, attempt: int) -> str:
    """A spare pod, created in `attempt` (a spare consumed by a swap is made again in a later
    attempt, under a new name). At most 50 + 2 + attempt digits + 2 + 2 characters."""
    return f"{job}-a{attempt}-s{spare}"


def spare_hostname(job: str, spare: int) -> str:
    return f"{job}-s{spare}"


def hostname(job: str, node_rank: int) -> str:
    """The pod's hostname, the same on every attempt: at most 50 + 1 + 4 = 55 characters, so a
    DNS label (63) for any CRD-valid job name and node count."""
    return f"{job}-{node_rank}"


def service_name(job: str) -> str:
    return job


def config_map_name(job: str) -> str:
    return f"{job}-config"


def network_policy_name(job: str) -> str:
    return job


def pvc_name(job: str) -> str:
    return f"{job}-checkpoints"


def trainer_account_name(job: str) -> str:
    """Name of the trainer's ServiceAccount, and of its Role and RoleBinding."""
    return f"{job}-trainer"


def coordinator_secret_name(job: str) -> str:
    """The Secret holding the job's coordinator key (paths.COORDINATOR_KEY)."""
    return f"{job}-coordinator"


def progress_lease_name(job: str) -> str:
    """The Lease rank 0 writes its progress record to; the trainer's Role names only it."""
    return f"{job}-progress"


def master_addr(job: str, namespace: str) -> str:
    """Stable DNS name of node 0's pod through the headless Service."""
    return f"{hostname(job, MASTER_NODE_RANK)}.{service_name(job)}.{namespace}.svc"
