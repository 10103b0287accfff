"""The renderer (pure): (job, plan, restart attempt) → every object the operator creates.

Like torchx's dryrun, the result is plain data that `mjob render` prints for review; only the
operator's `kube` module (or `mjob run --local`) acts on it. Names are deterministic, nothing here
is random, and the same inputs always give the same objects.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, overload

from megatron_contract import env as contract_env
from megatron_contract import paths
from megatron_contract.config import dumps
from megatron_contract.env import DEFAULT_MASTER_PORT
from megatron_contract.ladder import DEFAULT_COORDINATOR_PORT
from megatron_contract.paths import (
    CHECKPOINT_MOUNT,
    CONFIG_KEY,
    CONFIG_MOUNT,
    DEFAULT_CONFIG_PATH,
    MSC_CONFIG_MOUNT,
    SCRATCH_MOUNT,
)
from megatron_operator.api.job import API_VERSION, GROUP, KIND, PLURAL, MegatronJob
from megatron_operator.api.spec import EnvVar, MegatronJobSpec
from megatron_operator.core import network, tiers
from megatron_operator.core.defaults import DEFAULT_TRAINER_IMAGE, Platform
from megatron_operator.core.names import (
    ANNOTATION_LAYOUT,
    ANNOTATION_RESTART_STRATEGY,
    CONTAINER_NAME,
    LABEL_JOB_NAME,
    LABEL_JOB_UID,
    LABEL_MANAGED_BY,
    LABEL_NODE_RANK,
    LABEL_RESTART_ATTEMPT,
    LABEL_SPARE,
    MANAGED_BY,
    MASTER_NODE_RANK,
    SPEC_KEY,
    config_map_name,
    coordinator_secret_name,
    hostname,
    master_addr,
    network_policy_name,
    pod_name,
    progress_lease_name,
    pvc_name,
    service_name,
    spare_hostname,
    spare_pod_name,
    trainer_account_name,
)
from megatron_operator.core.overlay import overlay, prepared
from megatron_operator.core.planner import Plan
from megatron_operator.core.trainer_config import checkpoint_dir, restart_strategy, trainer_config

Obj = dict[str, Any]


def owner_reference(job: MegatronJob) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": job.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_labels(job: MegatronJob) -> dict[str, str]:
    """Labels on every child, so `-l megatron.dev/job-name=<job>` finds them all."""
    labels = {LABEL_JOB_NAME: job.name, LABEL_MANAGED_BY: MANAGED_BY}
    if job.metadata.uid:
        labels[LABEL_JOB_UID] = job.metadata.uid
    return labels


def _meta(job: MegatronJob, name: str, labels: dict[str, str] | None = None) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": job.namespace,
        "labels": {**job_labels(job), **(labels or {})},
    }
    if job.metadata.uid:
        meta["ownerReferences"] = [owner_reference(job)]
    return meta


def service(job: MegatronJob) -> Obj:
    """Headless Service publishing rank 0's DNS name, the MASTER_ADDR every rank dials
    (publishNotReadyAddresses, so the rendezvous works before readiness).

    It selects node-rank 0 only: nothing dials the other ranks by name (gloo and NCCL swap
    IPs through the store), and selecting every pod made each pod change of a 1,024-pod gang
    restart rewrite the Endpoints and a dozen EndpointSlices, slowing the whole control plane
    (docs/benchmarks.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB_NAME: job.name, LABEL_NODE_RANK: str(MASTER_NODE_RANK)},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": DEFAULT_MASTER_PORT,
                    "targetPort": DEFAULT_MASTER_PORT,
                },
                {
                    "name": "coordinator",
                    "port": DEFAULT_COORDINATOR_PORT,
                    "targetPort": DEFAULT_COORDINATOR_PORT,
                },
            ],
        },
    }


def recorded_spec(spec: MegatronJobSpec) -> MegatronJobSpec:
    """The spec as the ConfigMap records it: each spec.env value replaced by its SHA-256. The
    record only serves to compare a later spec with (api/transitions.py), and a ConfigMap is
    readable by anyone with the namespace's `view` role, while a value may be a token."""
    env = [
        EnvVar.model_validate(
            {"name": e.name, "value": "sha256:" + hashlib.sha256(e.value.encode()).hexdigest()}
        )
        for e in spec.env
    ]
    return spec.model_copy(update={"env": env})


def config_map(job: MegatronJob, plan: Plan) -> Obj:
    """The resolved trainer config, plus the spec it came from (`recorded_spec`): the operator
    compares a later spec with it to enforce which fields may change (api/transitions.py)."""
    text = dumps(trainer_config(job, plan))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, config_map_name(job.name)),
        "data": {
            CONFIG_KEY: text,
            SPEC_KEY: json.dumps(recorded_spec(job.spec).to_api(), sort_keys=True),
        },
    }


def network_policy(job: MegatronJob) -> Obj:
    """Admit to the job's pods only the job's own pods: the c10d rendezvous and the NCCL/gloo
    ports (chosen at random by the libraries, so every port) are closed to other tenants."""
    selector = {"matchLabels": {LABEL_JOB_NAME: job.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(job, network_policy_name(job.name)),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": selector}]}],
        },
    }


def pvc(job: MegatronJob) -> Obj | None:
    """The created checkpoint claim. Retained (the default), it has no ownerReference, so the
    garbage collector keeps it after the job; its job labels let a job re-created with the same
    name resume from it (core/ownership.py)."""
    volume = job.spec.checkpoint.volume
    create = volume.create if volume is not None else None
    if create is None:
        return None
    spec: Obj = {
        "accessModes": list(create.access_modes),
        "resources": {"requests": {"storage": str(create.size)}},
    }
    if create.storage_class_name is not None:
        spec["storageClassName"] = create.storage_class_name
    meta = _meta(job, pvc_name(job.name))
    if create.retention_policy.when_deleted == "Retain":
        meta.pop("ownerReferences", None)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def coordinator_secret(job: MegatronJob) -> Obj:
    """The Secret of the job's coordinator key. Rendered without the key: the operator's shell
    generates it when it creates the Secret (once: an existing Secret of the job is kept, as
    its running pods mount it). `mjob render` shows it so."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(job, coordinator_secret_name(job.name)),
        "type": "Opaque",
    }


def progress_lease(job: MegatronJob) -> Obj:
    """The Lease rank 0 writes its progress record to (docs/contract.md §4). Its renewTime is
    the heartbeat of the hang rule; the operator only creates it, the trainer only updates it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": _meta(job, progress_lease_name(job.name)),
        "spec": {},
    }


_PLATFORM = Platform()


def trainer_rbac(job: MegatronJob, platform: Platform = _PLATFORM) -> list[Obj]:
    """A ServiceAccount whose Role can write only this job's progress Lease and read (and
    watch) only this job, and nothing else: no pod verb at all, so user code cannot relabel its
    pod into a Service or another gang, and no status write, so it cannot forge a decision of
    the operator. The coordinator (the launcher of node rank 0) watches the job for the restart
    ladder's decisions (docs/architecture.md)."""
    name = trainer_account_name(job.name)
    account = _meta(job, name)
    if platform.service_account_annotations:
        # The platform's cloud identity (EKS IRSA, GKE Workload Identity): MegatronJobDefaults.
        account["annotations"] = dict(platform.service_account_annotations)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": account,
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(job, name),
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [progress_lease_name(job.name)],
                    "verbs": ["get", "update", "patch"],
                },
                {
                    "apiGroups": [GROUP],
                    "resources": [PLURAL],
                    "resourceNames": [job.name],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(job, name),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.namespace}],
        },
    ]


def _env(
    job: MegatronJob, plan: Plan, node_rank: int, attempt: int, coordinator: str | None = None
) -> list[Obj]:
    """`node_rank` is the pod's index: a spare's is plan.nodes + its number."""

    def field(path: str) -> Obj:
        return {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}

    e = contract_env
    plain = {
        e.MASTER_ADDR: master_addr(job.name, job.namespace),
        e.MASTER_PORT: str(DEFAULT_MASTER_PORT),
        e.WORLD_SIZE: str(plan.world_size),
        e.NNODES: str(plan.nodes),
        e.NODE_RANK: str(node_rank),
        e.NPROC_PER_NODE: str(plan.procs_per_node),
        e.CONFIG: DEFAULT_CONFIG_PATH,
        e.JOB_NAME: job.name,
        e.RESTART_ATTEMPT: str(attempt),
        e.PROGRESS_LEASE: progress_lease_name(job.name),
        **_layout_env(job, plan),
        e.RESTART_STRATEGY: restart_strategy(job),
        e.COORDINATOR_PORT: str(DEFAULT_COORDINATOR_PORT),
        e.COORDINATOR_KEY_FILE: paths.COORDINATOR_KEY_PATH,
    }
    spares = job.spec.resources.spare_nodes
    if spares:
        plain[e.SPARE_NODES] = str(spares)
        if node_rank >= plan.nodes:
            plain[e.SPARE_INDEX] = str(node_rank - plan.nodes)
        if coordinator:
            plain[e.COORDINATOR_ADDR] = coordinator
    env: list[Obj] = [{"name": k, "value": v} for k, v in plain.items()]
    env += [
        {"name": e.POD_NAME, "valueFrom": field("metadata.name")},
        {"name": e.POD_NAMESPACE, "valueFrom": field("metadata.namespace")},
        {"name": e.POD_IP, "valueFrom": field("status.podIP")},
    ]
    env += [{"name": k, "value": v} for k, v in network.env(job.spec).items()]
    env += [{"name": e.name, "value": e.value} for e in job.spec.env]
    msc = job.spec.checkpoint.msc
    if job.spec.checkpoint.url is not None and msc is not None:
        # After spec.env: the mounted Secret is the config the checkpoint URL was checked with.
        env.append({"name": e.MSC_CONFIG, "value": f"{MSC_CONFIG_MOUNT}/{msc.config_key}"})
        env.append({"name": e.SCRATCH, "value": SCRATCH_MOUNT})
    return env


def _layout_env(job: MegatronJob, plan: Plan) -> dict[str, str]:
    """The layout and the job's directories, for a command's $(VAR) arguments (and any code
    that prefers env to the config file)."""
    e, d = contract_env, plan.degrees
    out = {
        e.TP: str(d.tp),
        e.PP: str(d.pp),
        e.VPP: str(d.vpp or 1),
        e.CP: str(d.cp),
        e.EP: str(d.ep),
        e.ETP: str(d.etp),
        e.DP: str(d.dp),
        e.SEQUENCE_PARALLEL: "true" if d.sequence_parallel else "false",
        e.CHECKPOINT_DIR: checkpoint_dir(job),
    }
    data = job.spec.data
    if data is not None and data.volume is not None:
        out[e.DATA_DIR] = paths.DATA_MOUNT
    init = job.spec.checkpoint.init
    if init is not None and init.volume is not None:
        out[e.INIT_DIR] = paths.INIT_MOUNT
    if tiers.enabled(job.spec):
        out[e.MEMORY_CHECKPOINT_DIR] = paths.MEMORY_MOUNT
    return out


def _resources(job: MegatronJob, plan: Plan) -> Obj:
    r = job.spec.resources
    fabric = network.devices(job.spec)
    requests = {**{k: str(v) for k, v in r.requests.items()}, **fabric}
    limits = {**{k: str(v) for k, v in r.limits.items()}, **fabric}
    if r.accelerator != "none":
        # Extended resources must have requests equal to limits.
        requests[r.accelerator] = limits[r.accelerator] = str(plan.procs_per_node)
    out: Obj = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


_QUANTITY_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)")


def _positive(quantity: str | int) -> bool:
    """A quantity above zero (its number part; the suffix only scales it)."""
    if isinstance(quantity, int):
        return quantity > 0
    m = _QUANTITY_NUMBER.match(quantity)
    return m is not None and float(m.group(0)) > 0


def _needs_ipc_lock(job: MegatronJob) -> bool:
    # RDMA (verbs) pins memory, which needs IPC_LOCK; rdma/* is the device plugins' convention.
    # Only a positive request counts: `rdma/ib: 0` asks for no device, and IPC_LOCK would fail
    # the pod's baseline Pod Security level for nothing.
    r = job.spec.resources
    if not r.network.ipc_lock:
        return False  # the runtime raises RLIMIT_MEMLOCK instead (resources.network.ipcLock)
    entries = [*r.requests.items(), *r.limits.items()]
    rdma = any(k.startswith("rdma/") and _positive(v) for k, v in entries)
    return rdma or network.needs_ipc_lock(job.spec)


def _affinity(job: MegatronJob) -> Obj:
    selector = {"matchLabels": {LABEL_JOB_NAME: job.name}}
    affinity: Obj = {
        # One pod per node: ranks are planned per node, and two pods on one node would
        # double-book its GPUs' NVLink and NICs.
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    topo = job.spec.topology
    if topo.mode != "none" and topo.key:
        term = {"labelSelector": selector, "topologyKey": topo.key}
        if topo.mode == "required":
            affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        else:
            affinity["podAffinity"] = {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": term}
                ]
            }
    return affinity


def _volumes(job: MegatronJob, plan: Plan) -> tuple[list[Obj], list[Obj]]:
    """The pod's volumes, and the trainer container's mounts of them."""
    c = job.spec.checkpoint
    volumes: list[Obj] = [
        {"name": paths.VOLUME_CONFIG, "configMap": {"name": config_map_name(job.name)}}
    ]
    mounts: list[Obj] = [{"name": paths.VOLUME_CONFIG, "mountPath": CONFIG_MOUNT, "readOnly": True}]
    # The coordinator key: only the job's own pods mount it (the trainer's ServiceAccount cannot
    # read Secrets), so only its launchers can join its coordinator.
    volumes.append(
        {
            "name": paths.VOLUME_COORDINATOR,
            "secret": {
                "secretName": coordinator_secret_name(job.name),
                "items": [{"key": paths.COORDINATOR_KEY, "path": paths.COORDINATOR_KEY}],
                "defaultMode": 0o440,
            },
        }
    )
    mounts.append(
        {
            "name": paths.VOLUME_COORDINATOR,
            "mountPath": paths.COORDINATOR_KEY_MOUNT,
            "readOnly": True,
        }
    )
    if c.volume is not None:
        claim = c.volume.claim_name or pvc_name(job.name)
        volumes.append(
            {"name": paths.VOLUME_CHECKPOINTS, "persistentVolumeClaim": {"claimName": claim}}
        )
        mounts.append({"name": paths.VOLUME_CHECKPOINTS, "mountPath": CHECKPOINT_MOUNT})
    elif c.msc is not None:
        volumes.append(
            {
                "name": paths.VOLUME_MSC_CONFIG,
                "secret": {
                    "secretName": c.msc.config_secret,
                    "items": [{"key": c.msc.config_key, "path": c.msc.config_key}],
                    "defaultMode": 0o440,
                },
            }
        )
        volumes.append({"name": paths.VOLUME_SCRATCH, "emptyDir": {}})
        mounts.append(
            {"name": paths.VOLUME_MSC_CONFIG, "mountPath": MSC_CONFIG_MOUNT, "readOnly": True}
        )
        mounts.append({"name": paths.VOLUME_SCRATCH, "mountPath": SCRATCH_MOUNT})
    volumes.append(
        {
            "name": paths.VOLUME_SHM,
            "emptyDir": {"medium": "Memory", "sizeLimit": str(job.spec.resources.shm_size)},
        }
    )
    mounts.append({"name": paths.VOLUME_SHM, "mountPath": paths.SHM_MOUNT})
    if tiers.enabled(job.spec):
        # The in-memory checkpoints (core/tiers.py): tmpfs, charged to the pod's memory; it
        # outlives the ranks of an in-place restart and dies with the pod.
        memory: Obj = {"medium": "Memory"}
        held = memory_volume_bytes(job, plan)
        if held is not None:
            memory["sizeLimit"] = tiers.size_limit(held)
        volumes.append({"name": paths.VOLUME_MEMORY, "emptyDir": memory})
        mounts.append({"name": paths.VOLUME_MEMORY, "mountPath": paths.MEMORY_MOUNT})
    data = job.spec.data.volume if job.spec.data is not None else None
    if data is not None:
        _claim(
            volumes,
            mounts,
            paths.VOLUME_DATA,
            paths.DATA_MOUNT,
            data.claim_name,
            data.read_only,
            data.sub_path,
        )
    init = job.spec.checkpoint.init
    if init is not None and init.volume is not None:
        v = init.volume
        _claim(volumes, mounts, paths.VOLUME_INIT, paths.INIT_MOUNT, v.claim_name, True, v.sub_path)
    return volumes, mounts


def _claim(
    volumes: list[Obj],
    mounts: list[Obj],
    name: str,
    path: str,
    claim: str,
    read_only: bool,
    sub_path: str | None,
) -> None:
    source: Obj = {"claimName": claim}
    mount: Obj = {"name": name, "mountPath": path}
    if read_only:
        # Both: the claim's readOnly makes the kubelet mount it so, the mount's tells the runtime.
        source["readOnly"] = mount["readOnly"] = True
    if sub_path:
        mount["subPath"] = sub_path
    volumes.append({"name": name, "persistentVolumeClaim": source})
    mounts.append(mount)


def _launcher(job: MegatronJob, platform: Platform) -> tuple[list[str], Obj | None]:
    """The trainer container's command, and the init container that delivers the launcher.

    The built-in trainer's image holds the launcher (`python -m megatron_trainer`). A
    trainer.command runs in the user's image, unchanged: the operator's image copies the
    launcher zipapp into an emptyDir, and the image's own python3 runs it (3.8 or newer)."""
    if job.spec.trainer is None:
        return ["python", "-m", "megatron_trainer"], None
    init: Obj = {
        "name": paths.INIT_CONTAINER_LAUNCHER,
        "image": platform.launcher_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["mjob", "launcher", "install", paths.LAUNCHER_ZIPAPP],
        "volumeMounts": [{"name": paths.VOLUME_LAUNCHER, "mountPath": paths.LAUNCHER_MOUNT}],
        "resources": {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
        },
    }
    return ["python3", paths.LAUNCHER_ZIPAPP], init


def _pod_security(platform: Platform) -> Obj:
    ids = {
        "runAsUser": platform.run_as_user,
        "runAsGroup": platform.run_as_group,
        "fsGroup": platform.fs_group,
    }
    out: Obj = {"runAsNonRoot": True, **{k: v for k, v in ids.items() if v is not None}}
    if platform.fs_group is not None:
        # Without it the kubelet chowns the whole checkpoint volume (terabytes) at every
        # start; with it, only when the volume's root is not already ours.
        out["fsGroupChangePolicy"] = "OnRootMismatch"
    out["seccompProfile"] = {"type": "RuntimeDefault"}
    return out


def pod(
    job: MegatronJob,
    plan: Plan,
    node_rank: int,
    attempt: int,
    platform: Platform = _PLATFORM,
    template: Obj | None = None,
    coordinator: str | None = None,
) -> Obj:
    """One node's pod, with spec.template laid over it (core/overlay.py; `template` is
    `overlay.prepared(job.spec.template)` when the caller holds it). The template's parts are
    shared with the job's other pods: read-only.

    `node_rank` is the pod's index: from plan.nodes on, the job's spare pods (`<job>-a<attempt>-
    s<n>`, resources.spareNodes), alike but for their name, hostname, labels and NODE_RANK.
    `coordinator`: the coordinator's address when it moved off node rank 0's pod (with spares)."""
    s = job.spec
    spare = node_rank - plan.nodes if node_rank >= plan.nodes else None
    volumes, mounts = _volumes(job, plan)
    caps: Obj = {"drop": ["ALL"]}
    if _needs_ipc_lock(job):
        caps["add"] = ["IPC_LOCK"]
    command, launcher = _launcher(job, platform)
    if launcher is not None:
        volumes.append({"name": paths.VOLUME_LAUNCHER, "emptyDir": {"sizeLimit": "64Mi"}})
        mounts.append(
            {"name": paths.VOLUME_LAUNCHER, "mountPath": paths.LAUNCHER_MOUNT, "readOnly": True}
        )
    container: Obj = {
        "name": CONTAINER_NAME,
        # Unset once the platform's defaults are merged (core/defaults.py): the built-in name.
        "image": s.image or DEFAULT_TRAINER_IMAGE,
        "imagePullPolicy": s.image_pull_policy,
        "command": command,
        # The trainer writes why it stopped to the termination log; a crash that writes nothing
        # leaves the log's tail there instead, so status.lastFailure always says something.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": _env(job, plan, node_rank, attempt, coordinator),
        "ports": [
            {"name": "rendezvous", "containerPort": DEFAULT_MASTER_PORT},
            {"name": "coordinator", "containerPort": DEFAULT_COORDINATOR_PORT},
        ],
        "resources": _resources(job, plan),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": caps,
            "runAsNonRoot": True,
        },
    }
    spec: Obj = {
        "restartPolicy": "Never",
        # Stable across attempts: <hostname>.<subdomain> is the DNS name behind MASTER_ADDR.
        "hostname": hostname(job.name, node_rank)
        if spare is None
        else spare_hostname(job.name, spare),
        "subdomain": service_name(job.name),
        "serviceAccountName": trainer_account_name(job.name),
        # Time for the trainer to save a checkpoint after SIGTERM.
        "terminationGracePeriodSeconds": s.checkpoint.grace_period_seconds,
        "enableServiceLinks": False,
        "securityContext": _pod_security(platform),
        "affinity": _affinity(job),
        "containers": [container],
        "volumes": volumes,
    }
    if launcher is not None:
        spec["initContainers"] = [launcher]
    if s.resources.node_selector:
        spec["nodeSelector"] = dict(s.resources.node_selector)
    if s.resources.tolerations:
        spec["tolerations"] = [t.to_api() for t in s.resources.tolerations]
    if s.priority_class_name:
        spec["priorityClassName"] = s.priority_class_name
    labels = {
        LABEL_RESTART_ATTEMPT: str(attempt),
        LABEL_NODE_RANK: str(node_rank),
    }
    if spare is not None:
        labels[LABEL_SPARE] = str(spare)
    meta = _meta(job, slot_name(job.name, plan, node_rank, attempt), labels)
    meta["annotations"] = {
        ANNOTATION_LAYOUT: plan.layout_string(),
        ANNOTATION_RESTART_STRATEGY: restart_strategy(job),
    }
    rendered = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    return overlay(rendered, s.template, template)


def slot_name(job: str, plan: Plan, node_rank: int, attempt: int) -> str:
    """The name of the pod of index `node_rank` (a spare's from plan.nodes on)."""
    if node_rank >= plan.nodes:
        return spare_pod_name(job, node_rank - plan.nodes, attempt)
    return pod_name(job, node_rank, attempt)


def gang_slots(job: MegatronJob, plan: Plan) -> range:
    """The pod indexes of a whole gang: its node ranks, then its spares."""
    return range(plan.nodes + job.spec.resources.spare_nodes)


def pods(job: MegatronJob, plan: Plan, attempt: int, platform: Platform = _PLATFORM) -> list[Obj]:
    return list(Pods(job, plan, gang_slots(job, plan), attempt, platform=platform))


class Pods(Sequence[Obj]):
    """Pods of one attempt, rendered one at a time as they are read: the creates of a 1,024-pod
    gang read them batch by batch (cluster/kube.py), so the gang is never in memory whole, and
    every pod shares the one prepared template. Names need no rendering. `patch` is applied to
    each pod as it is rendered (the Kueue admission). `ranks` are pod indexes: the spares' from
    plan.nodes on."""

    def __init__(
        self,
        job: MegatronJob,
        plan: Plan,
        ranks: Sequence[int],
        attempt: int,
        patch: Callable[[Obj], Obj] | None = None,
        template: Obj | None = None,
        platform: Platform = _PLATFORM,
        coordinator: str | None = None,
    ) -> None:
        self.job, self.plan, self.ranks, self.attempt, self.patch = job, plan, ranks, attempt, patch
        self.platform = platform
        self.coordinator = coordinator
        if template is None and job.spec.template is not None:
            template = prepared(job.spec.template)
        self.template = template

    def __len__(self) -> int:
        return len(self.ranks)

    @overload
    def __getitem__(self, index: int) -> Obj: ...

    @overload
    def __getitem__(self, index: slice) -> Pods: ...

    def __getitem__(self, index: int | slice) -> Obj | Pods:
        if isinstance(index, slice):
            return self._with(self.ranks[index])
        obj = pod(
            self.job,
            self.plan,
            self.ranks[index],
            self.attempt,
            self.platform,
            self.template,
            self.coordinator,
        )
        return self.patch(obj) if self.patch is not None else obj

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Pods)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Pods({self.job.name}, attempt {self.attempt}, ranks {list(self.ranks)})"

    def _with(self, ranks: Sequence[int], patch: Callable[[Obj], Obj] | None = None) -> Pods:
        return Pods(
            self.job,
            self.plan,
            ranks,
            self.attempt,
            patch or self.patch,
            self.template,
            self.platform,
            self.coordinator,
        )

    @property
    def names(self) -> list[str]:
        return [slot_name(self.job.name, self.plan, r, self.attempt) for r in self.ranks]

    def without(self, names: Collection[str]) -> Pods:
        """These pods but those named."""
        return self._with(
            [r for r, n in zip(self.ranks, self.names, strict=True) if n not in names]
        )

    def patched(self, patch: Callable[[Obj], Obj]) -> Pods:
        """These pods, each with `patch` applied (after any patch they had)."""
        before = self.patch
        return self._with(self.ranks, patch if before is None else lambda o: patch(before(o)))


def children(
    job: MegatronJob, plan: Plan, *, isolate: bool = False, platform: Platform = _PLATFORM
) -> list[Obj]:
    """The children other than pods, in creation order: identity, progress Lease, coordinator
    key, config, Service, claim, and with `isolate` the NetworkPolicy (the operator's
    --network-policy)."""
    objs: list[Obj] = [
        *trainer_rbac(job, platform),
        progress_lease(job),
        coordinator_secret(job),
        config_map(job, plan),
        service(job),
    ]
    if isolate:
        objs.append(network_policy(job))
    claim = pvc(job)
    if claim is not None:
        objs.append(claim)
    return objs


def render(
    job: MegatronJob,
    plan: Plan,
    attempt: int = 0,
    *,
    isolate: bool = False,
    platform: Platform = _PLATFORM,
) -> list[Obj]:
    """Every child object, in creation order: identity and config first, then pods."""
    return [
        *children(job, plan, isolate=isolate, platform=platform),
        *pods(job, plan, attempt, platform),
    ]


def render_iter(
    job: MegatronJob,
    plan: Plan,
    attempt: int = 0,
    *,
    isolate: bool = False,
    platform: Platform = _PLATFORM,
) -> Iterator[Obj]:
    """`render`, one object at a time: `mjob render` of a 4,096-pod job writes each pod as it is
    rendered instead of holding them all (and their YAML) in memory."""
    yield from children(job, plan, isolate=isolate, platform=platform)
    yield from Pods(job, plan, gang_slots(job, plan), attempt, platform=platform)


def as_list(objs: list[Obj]) -> Obj:
    """Wrap objects in a `v1/List`, the form `kubectl apply -f` accepts."""
    return {"apiVersion": "v1", "kind": "List", "items": objs}


def memory_volume_bytes(job: MegatronJob, plan: Plan) -> int | None:
    """What the in-memory checkpoints' volume holds per pod (core/tiers.py), when estimable."""
    precision = plan.training.precision if plan.training is not None else None
    return tiers.volume_bytes(job.spec, plan.memory, plan.degrees, precision)
