"""`spec.template`: the cluster's own pod conventions, overlaid on the pods the operator renders.

A subset of a PodTemplateSpec, as JobSet's and Kubeflow Trainer's templates give it: labels and
annotations, extra volumes, init and sidecar containers, image pull secrets, scheduling fields,
DNS and the pod's security context, and, for the container named `trainer`, extra env, envFrom,
volume mounts and resource entries. Lists are merged by name as a strategic merge patch does for a
PodSpec (core/overlay.py). What the operator owns is refused here, and by the CRD's CEL rules with
the same words (api/cel.py, parity-tested in tests/unit/test_template.py):

- the volumes behind the operator's mounts, and those mount paths;
- the contract env (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, … and every `MEGATRON_` name);
- the pod fields that make the gang work (restartPolicy, hostname, subdomain, the service
  account, …), the `megatron.dev/` labels, and the trainer's image, command and arguments.

Nested Kubernetes objects (a volume's source, a probe, an affinity term) are declared field by
field with a cap on every list, map and string (api/podtypes.py, api/volumes.py), so one job cannot
store megabytes in them; the apiserver validates the rest when the pod is created, and a refusal
shows on the job as the CreateFailure condition. Every container of the job's pods is held to the
restricted Pod Security level (plus IPC_LOCK for RDMA) whatever the namespace's level, and a pod
affinity term may not reach other namespaces (podtypes.WHY says why for each).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from megatron_contract import env as contract_env
from megatron_contract import paths
from megatron_contract.bounds import MAX_DURATION_SECONDS
from megatron_contract.choices import ACCELERATORS, CPU

from .base import (
    GROUP,
    ApiModel,
    DnsSubdomain,
    EnvName,
    LabelKey,
    LabelValue,
    Quantity,
    Toleration,
)
from .podtypes import (
    WHY,
    Affinity,
    ContainerPort,
    DnsConfig,
    EnvFromSource,
    Lifecycle,
    PodSecurityContext,
    Probe,
    ResizePolicy,
    ResourceClaimRef,
    SecurityContext,
    VolumeDevice,
)
from .volumes import (
    AwsEbsSource,
    AzureDiskSource,
    AzureFileSource,
    CephFsSource,
    CinderSource,
    ConfigMapSource,
    CsiSource,
    DownwardApiSource,
    EmptyDirSource,
    EphemeralSource,
    FcSource,
    FlexVolumeSource,
    FlockerSource,
    GcePdSource,
    GitRepoSource,
    GlusterfsSource,
    HostPathSource,
    ImageSource,
    IscsiSource,
    NfsSource,
    PersistentVolumeClaimSource,
    PhotonPdSource,
    PortworxSource,
    ProjectedSource,
    QuobyteSource,
    RbdSource,
    ScaleIoSource,
    SecretSource,
    StorageOsSource,
    VsphereSource,
)

MAX_LIST: Final = 64  # volumes, mounts, secrets, tolerations
# Containers (init and sidecars) and mount paths are bounded tighter: the CRD's rules look at
# every mount of every container, and the apiserver prices that by these bounds.
MAX_CONTAINERS: Final = 16
MAX_MOUNT_PATH: Final = 1024
MAX_ENV: Final = 256
MAX_STRING: Final = 4096
MAX_CONTAINER_PORTS: Final = 16

TRAINER_CONTAINER: Final = paths.CONTAINER_NAME
OWNED_LABEL_PREFIXES: Final = (f"{GROUP}/", "kueue.x-k8s.io/")
OWNED_ANNOTATION_PREFIXES: Final = (f"{GROUP}/",)

# Each refusal says why; the CEL rules carry the same sentences.
OWNED_VOLUMES: Final[dict[str, str]] = {
    paths.VOLUME_CONFIG: f"the resolved trainer config, mounted at {paths.CONFIG_MOUNT}",
    paths.VOLUME_CHECKPOINTS: "the checkpoint volume (spec.checkpoint.volume), mounted at "
    f"{paths.CHECKPOINT_MOUNT}",
    paths.VOLUME_SHM: f"the memory-backed {paths.SHM_MOUNT} (spec.resources.shmSize)",
    paths.VOLUME_DATA: f"spec.data.volume, mounted at {paths.DATA_MOUNT}",
    paths.VOLUME_INIT: f"spec.checkpoint.init.volume, mounted at {paths.INIT_MOUNT}",
    paths.VOLUME_MSC_CONFIG: "spec.checkpoint.msc.configSecret, mounted at "
    f"{paths.MSC_CONFIG_MOUNT}",
    paths.VOLUME_SCRATCH: f"the scratch directory of checkpoint.url, at {paths.SCRATCH_MOUNT}",
    paths.VOLUME_LAUNCHER: f"a trainer.command's launcher, at {paths.LAUNCHER_MOUNT}",
    paths.VOLUME_COORDINATOR: "the launchers' coordinator key, mounted at "
    f"{paths.COORDINATOR_KEY_MOUNT}",
}
LAUNCHER_INIT_CONTAINER: Final = paths.INIT_CONTAINER_LAUNCHER
LAUNCHER_WHY: Final = (
    f"{LAUNCHER_INIT_CONTAINER!r} is the operator's init container that delivers a "
    "trainer.command's launcher: choose another name"
)
OWNED_MOUNT_PATHS: Final = (
    paths.CONFIG_MOUNT,
    paths.CHECKPOINT_MOUNT,
    paths.SHM_MOUNT,
    paths.DATA_MOUNT,
    paths.INIT_MOUNT,
    paths.MSC_CONFIG_MOUNT,
    paths.SCRATCH_MOUNT,
    paths.LAUNCHER_MOUNT,
    paths.COORDINATOR_KEY_MOUNT,
)
# Pod fields the gang depends on (camelCase): why each is the operator's.
OWNED_POD_FIELDS: Final[dict[str, str]] = {
    "restartPolicy": "pods run with restartPolicy Never: the operator restarts the whole gang "
    "(spec.restartPolicy)",
    "hostname": "the stable <job>-<node rank> hostname is the DNS name behind MASTER_ADDR",
    "subdomain": "the job's headless Service is the subdomain behind MASTER_ADDR",
    "serviceAccountName": "the trainer's own ServiceAccount may write only the job's progress "
    "Lease",
    "serviceAccount": "the trainer's own ServiceAccount may write only the job's progress Lease",
    "nodeName": "pods are placed by the scheduler (and admitted by Kueue): use nodeSelector or "
    "affinity",
    "terminationGracePeriodSeconds": "it is spec.checkpoint.gracePeriodSeconds, the time to save "
    "a checkpoint on SIGTERM",
    "priorityClassName": "use spec.priorityClassName (Kueue reads it from there)",
}
# Fields of the trainer container a template may not set, and why; the rest of a Container's
# fields are allowed only on the other containers.
TRAINER_ALLOWED: Final = ("name", "env", "envFrom", "volumeMounts", "resources")
_OWNED_CONTAINER_WHY: Final[dict[str, str]] = {
    "image": "use spec.image",
    "imagePullPolicy": "use spec.imagePullPolicy",
    "command": "the launcher runs every rank: use spec.trainer.command",
    "args": "the launcher runs every rank: use spec.trainer.args",
}
_OTHER_WHY: Final = (
    "the operator sets the trainer container's {field}; a template may add only env, envFrom, "
    "volumeMounts and resources entries to it"
)
OWNED_ENV_WHY: Final = (
    "this name is set by the operator or the launcher (the env contract: RANK, WORLD_SIZE, "
    "MASTER_ADDR, MEGATRON_*, …)"
)
GPU_RESOURCES: Final = tuple(a for a in ACCELERATORS if a != CPU)
GPU_WHY: Final = "the GPU count is set from spec.resources.procsPerNode"
OWNED_MOUNT_WHY: Final = (
    f"the operator mounts its volumes ({', '.join(OWNED_VOLUMES)}) at "
    + ", ".join(OWNED_MOUNT_PATHS)
    + " in the trainer container"
)


def container_field_why(field: str) -> str:
    return _OWNED_CONTAINER_WHY.get(field) or _OTHER_WHY.format(field=field)


def env_name_owned(name: str) -> bool:
    return name in contract_env.OWNED or name.startswith(contract_env.OWNED_PREFIX)


def mount_path_owned(path: str) -> bool:
    """At or under one of the operator's mounts (the CRD's rule is the same expression; a path
    that is not in normal form is refused on its own, MOUNT_PATH_WHY, so `//etc/megatron` and
    `/etc/./megatron` cannot pass as another path)."""
    return any((path + "/").startswith(p + "/") for p in OWNED_MOUNT_PATHS)


# A path with an empty, '.' or '..' segment (the CRD states the same pattern).
NOT_NORMAL_PATH_PATTERN: Final = r"//|(^|/)[.][.]?(/|$)"
# As RE2 reads the pattern: `$` only at the very end (Python's would match before a last '\n').
_NOT_NORMAL_PATH = re.compile(NOT_NORMAL_PATH_PATTERN.replace("$", r"\Z"))
MOUNT_PATH_WHY: Final = (
    "a mount path of the trainer container must be in normal form (no '//', '.' or '..' "
    "segment): the operator compares it with its own mount paths"
)


def by_name(key: str = "name") -> dict[str, Any]:
    """A list merged by `key`, which the apiserver then keeps unique (a strategic merge key)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


Name = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
Text = Annotated[str, Field(max_length=MAX_STRING)]


class KeyRef(ApiModel):
    """A key of a Secret or ConfigMap in the job's namespace."""

    name: DnsSubdomain = Field(description="The Secret's or ConfigMap's name.")
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(description="The key.")
    optional: bool | None = Field(None, description="Start even when it does not exist.")


class FieldRef(ApiModel):
    """A field of the pod (the downward API)."""

    field_path: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="e.g. metadata.name, metadata.annotations['x'], status.podIP."
    )
    api_version: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="Version of the schema the path is in (default v1)."
    )


class ResourceFieldRef(ApiModel):
    """A container's resource request or limit."""

    resource: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        description="e.g. limits.cpu, requests.memory."
    )
    container_name: Name | None = Field(None, description="Container (default: this one).")
    divisor: Quantity | None = Field(None, description="Divide the value by this (default 1).")


class EnvSource(ApiModel):
    """Where an env value comes from: exactly one of these."""

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(None, description="A field of the pod.")
    resource_field_ref: ResourceFieldRef | None = Field(
        None, description="A resource request or limit."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvSource:
        given = [
            v
            for v in (
                self.secret_key_ref,
                self.config_map_key_ref,
                self.field_ref,
                self.resource_field_ref,
            )
            if v is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef"
            )
        return self


class ContainerEnv(ApiModel):
    """An env var of a container: a value, or a reference (a Secret's key stays out of the
    job's spec and ConfigMap)."""

    name: EnvName = Field(description="Variable name.")
    value: Annotated[str, Field(max_length=32768)] | None = Field(None, description="Value.")
    value_from: EnvSource | None = Field(None, description="Where the value comes from.")

    @model_validator(mode="after")
    def _one_source(self) -> ContainerEnv:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set value or valueFrom, not both")
        return self


class VolumeMount(ApiModel):
    """A volume mounted into a container."""

    name: Name = Field(description="The volume (spec.template.spec.volumes or the operator's).")
    mount_path: Annotated[str, Field(min_length=1, max_length=MAX_MOUNT_PATH)] = Field(
        description="Where in the container."
    )
    read_only: bool | None = Field(None, description="Mount read-only.")
    recursive_read_only: Literal["Disabled", "IfPossible", "Enabled"] | None = Field(
        None, description="Read-only all the way down (needs readOnly)."
    )
    sub_path: Text | None = Field(None, description="A path inside the volume.")
    sub_path_expr: Text | None = Field(None, description="subPath with $(VAR) from the env.")
    mount_propagation: Literal["None", "HostToContainer", "Bidirectional"] | None = Field(
        None, description="Mount propagation (Bidirectional is refused)."
    )

    @field_validator("mount_propagation")
    @classmethod
    def _not_bidirectional(cls, value: str | None) -> str | None:
        if value == "Bidirectional":
            raise ValueError(WHY["mountPropagation"])
        return value


class ContainerResources(ApiModel):
    """Resource entries; the trainer's are merged key by key into the operator's."""

    requests: dict[Annotated[str, Field(max_length=253)], Quantity] | None = Field(
        None, max_length=MAX_LIST, description="Requests, e.g. {rdma/ib: 1}."
    )
    limits: dict[Annotated[str, Field(max_length=253)], Quantity] | None = Field(
        None, max_length=MAX_LIST, description="Limits."
    )
    claims: list[ResourceClaimRef] | None = Field(
        None, max_length=MAX_LIST, description="Dynamic resource claims the container uses."
    )


class Container(ApiModel):
    """A container: an init container, a sidecar, or the trainer (name `trainer`), whose
    entries here are merged into the operator's trainer container."""

    name: Name = Field(description="Container name; `trainer` patches the operator's container.")
    image: Annotated[str, Field(min_length=1, max_length=1024)] | None = Field(
        None, description="Image (required, except on `trainer`, where spec.image is used)."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Pull policy."
    )
    command: list[Text] | None = Field(None, max_length=MAX_LIST, description="Entrypoint.")
    args: list[Text] | None = Field(None, max_length=1024, description="Arguments.")
    working_dir: Text | None = Field(None, description="Working directory.")
    env: list[ContainerEnv] | None = Field(
        None,
        max_length=MAX_ENV,
        description="Env vars (merged by name).",
        json_schema_extra=by_name(),
    )
    env_from: list[EnvFromSource] | None = Field(
        None, max_length=MAX_LIST, description="Env from whole Secrets or ConfigMaps."
    )
    volume_mounts: list[VolumeMount] | None = Field(
        None,
        max_length=MAX_LIST,
        description="Volume mounts.",
        json_schema_extra=by_name("mountPath"),
    )
    volume_devices: list[VolumeDevice] | None = Field(
        None, max_length=MAX_LIST, description="Raw block devices."
    )
    resources: ContainerResources | None = Field(None, description="Resource entries.")
    resize_policy: list[ResizePolicy] | None = Field(
        None, max_length=8, description="In-place resize policy."
    )
    restart_policy: Literal["Always"] | None = Field(
        None,
        description="Always, on an init container: a native sidecar (runs beside the trainer).",
    )
    ports: list[ContainerPort] | None = Field(
        None, max_length=MAX_CONTAINER_PORTS, description="Ports (no hostPort)."
    )
    liveness_probe: Probe | None = Field(None, description="Liveness probe.")
    readiness_probe: Probe | None = Field(None, description="Readiness probe.")
    startup_probe: Probe | None = Field(None, description="Startup probe.")
    lifecycle: Lifecycle | None = Field(None, description="postStart and preStop hooks.")
    security_context: SecurityContext | None = Field(
        None, description="The container's security context, held to restricted."
    )
    termination_message_path: Text | None = Field(None, description="Termination message file.")
    termination_message_policy: Literal["File", "FallbackToLogsOnError"] | None = Field(
        None, description="Termination message policy."
    )
    stdin: bool | None = Field(None, description="Allocate a stdin buffer.")
    stdin_once: bool | None = Field(None, description="Close stdin after one attach.")
    tty: bool | None = Field(None, description="Allocate a TTY.")

    @field_validator("env")
    @classmethod
    def _env(
        cls, value: list[ContainerEnv] | None, info: ValidationInfo
    ) -> list[ContainerEnv] | None:
        _unique([e.name for e in value or []], "env name")
        if info.data.get("name") == TRAINER_CONTAINER:
            owned = sorted({e.name for e in value or [] if env_name_owned(e.name)})
            if owned:
                raise ValueError(f"{', '.join(owned)}: {OWNED_ENV_WHY}")
        return value

    @field_validator("volume_mounts")
    @classmethod
    def _mounts(
        cls, value: list[VolumeMount] | None, info: ValidationInfo
    ) -> list[VolumeMount] | None:
        _unique([m.mount_path for m in value or []], "mountPath")
        if info.data.get("name") == TRAINER_CONTAINER:
            for m in value or []:
                if _NOT_NORMAL_PATH.search(m.mount_path):
                    raise ValueError(f"{m.mount_path}: {MOUNT_PATH_WHY}")
                if mount_path_owned(m.mount_path) or m.name in OWNED_VOLUMES:
                    raise ValueError(f"{m.name} at {m.mount_path}: {OWNED_MOUNT_WHY}")
        return value

    @field_validator("resources")
    @classmethod
    def _resources(
        cls, value: ContainerResources | None, info: ValidationInfo
    ) -> ContainerResources | None:
        if value is not None and info.data.get("name") == TRAINER_CONTAINER:
            for kind in ("requests", "limits"):
                gpus = [k for k in getattr(value, kind) or {} if k in GPU_RESOURCES]
                if gpus:
                    raise ValueError(f"{kind} {', '.join(gpus)}: {GPU_WHY}")
        return value

    @model_validator(mode="after")
    def _trainer_fields(self) -> Container:
        if self.name != TRAINER_CONTAINER:
            if self.image is None:
                raise ValueError(f"container {self.name!r} needs an image")
            return self
        owned = [k for k in self.to_api() if k not in TRAINER_ALLOWED]
        if owned:
            raise ValueError(
                "the trainer container: "
                + "; ".join(f"{k}: {container_field_why(k)}" for k in owned)
            )
        return self


def _volume_not_owned(value: str) -> str:
    if value in OWNED_VOLUMES:
        raise ValueError(f"{value!r} is the operator's volume ({OWNED_VOLUMES[value]})")
    return value


# Every volume source of a core/v1 Volume (Kubernetes 1.34), each kept as given: declared so that
# CEL (the chart's admission policy) sees which one a volume uses, and an unknown key is refused.
VOLUME_SOURCES: Final = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
)


class Volume(ApiModel):
    """A pod volume: its name and one source (a claim, a Secret, NFS, a CSI driver, …)."""

    name: Name = Field(description="Volume name, used by volumeMounts.")
    aws_elastic_block_store: AwsEbsSource | None = Field(
        None, description="The awsElasticBlockStore source."
    )
    azure_disk: AzureDiskSource | None = Field(None, description="The azureDisk source.")
    azure_file: AzureFileSource | None = Field(None, description="The azureFile source.")
    cephfs: CephFsSource | None = Field(None, description="The cephfs source.")
    cinder: CinderSource | None = Field(None, description="The cinder source.")
    config_map: ConfigMapSource | None = Field(None, description="The configMap source.")
    csi: CsiSource | None = Field(None, description="The csi source.")
    downward_api: DownwardApiSource | None = Field(
        None, alias="downwardAPI", description="The downwardAPI source."
    )
    empty_dir: EmptyDirSource | None = Field(None, description="The emptyDir source.")
    ephemeral: EphemeralSource | None = Field(None, description="The ephemeral source.")
    fc: FcSource | None = Field(None, description="The fc source.")
    flex_volume: FlexVolumeSource | None = Field(None, description="The flexVolume source.")
    flocker: FlockerSource | None = Field(None, description="The flocker source.")
    gce_persistent_disk: GcePdSource | None = Field(
        None, description="The gcePersistentDisk source."
    )
    git_repo: GitRepoSource | None = Field(None, description="The gitRepo source.")
    glusterfs: GlusterfsSource | None = Field(None, description="The glusterfs source.")
    host_path: HostPathSource | None = Field(None, description="The hostPath source.")
    image: ImageSource | None = Field(None, description="The image source.")
    iscsi: IscsiSource | None = Field(None, description="The iscsi source.")
    nfs: NfsSource | None = Field(None, description="The nfs source.")
    persistent_volume_claim: PersistentVolumeClaimSource | None = Field(
        None, description="The persistentVolumeClaim source."
    )
    photon_persistent_disk: PhotonPdSource | None = Field(
        None, description="The photonPersistentDisk source."
    )
    portworx_volume: PortworxSource | None = Field(None, description="The portworxVolume source.")
    projected: ProjectedSource | None = Field(None, description="The projected source.")
    quobyte: QuobyteSource | None = Field(None, description="The quobyte source.")
    rbd: RbdSource | None = Field(None, description="The rbd source.")
    scale_io: ScaleIoSource | None = Field(None, alias="scaleIO", description="The scaleIO source.")
    secret: SecretSource | None = Field(None, description="The secret source.")
    storageos: StorageOsSource | None = Field(None, description="The storageos source.")
    vsphere_volume: VsphereSource | None = Field(None, description="The vsphereVolume source.")

    @field_validator("name")
    @classmethod
    def _not_owned(cls, value: str) -> str:
        return _volume_not_owned(value)


class SecretName(ApiModel):
    """A Secret holding registry credentials."""

    name: DnsSubdomain = Field(description="The Secret's name (in the job's namespace).")


class TemplateMetadata(ApiModel):
    """Labels and annotations added to every pod (e.g. Multus network annotations)."""

    labels: dict[LabelKey, LabelValue] | None = Field(
        None,
        max_length=MAX_LIST,
        description="Pod labels; megatron.dev/ and kueue.x-k8s.io/ keys are the operator's.",
    )
    annotations: dict[LabelKey, Annotated[str, Field(max_length=65536)]] | None = Field(
        None,
        max_length=MAX_LIST,
        description="Pod annotations; megatron.dev/ keys are the operator's.",
    )

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        _no_prefix(value, OWNED_LABEL_PREFIXES, "label")
        return value

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        _no_prefix(value, OWNED_ANNOTATION_PREFIXES, "annotation")
        return value


def _no_prefix(value: dict[str, str] | None, prefixes: tuple[str, ...], what: str) -> None:
    bad = [k for k in value or {} if k.startswith(prefixes)]
    if bad:
        raise ValueError(
            f"{what} {', '.join(sorted(bad))}: {' and '.join(prefixes)} keys are set by the "
            "operator"
        )


def _unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    dups = sorted({n for n in names if n in seen or seen.add(n)})  # type: ignore[func-returns-value]
    if dups:
        raise ValueError(f"duplicate {what} {', '.join(dups)}: each may appear once")


class TemplatePodSpec(ApiModel):
    """The pod fields a template may set. Lists are appended to the operator's, merged by name."""

    volumes: list[Volume] | None = Field(
        None, max_length=MAX_LIST, description="Extra volumes.", json_schema_extra=by_name()
    )
    init_containers: list[Container] | None = Field(
        None,
        max_length=MAX_CONTAINERS,
        description="Init containers, before the trainer starts; restartPolicy Always makes a "
        "native sidecar.",
        json_schema_extra=by_name(),
    )
    containers: list[Container] | None = Field(
        None,
        max_length=MAX_CONTAINERS,
        description="Sidecars, and `trainer`: extra env, envFrom, volumeMounts and resources for "
        "the trainer container.",
        json_schema_extra=by_name(),
    )
    image_pull_secrets: list[SecretName] | None = Field(
        None, max_length=MAX_LIST, description="Registry credentials.", json_schema_extra=by_name()
    )
    node_selector: dict[LabelKey, LabelValue] | None = Field(
        None,
        max_length=MAX_LIST,
        description="More node labels to match (with spec.resources.nodeSelector).",
    )
    affinity: Affinity | None = Field(
        None,
        description="nodeAffinity as given; podAffinity and podAntiAffinity terms are added to "
        "the operator's (one pod per node, topology packing).",
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=MAX_LIST, description="More tolerations."
    )
    scheduler_name: DnsSubdomain | None = Field(None, description="Scheduler of the pods.")
    runtime_class_name: DnsSubdomain | None = Field(
        None, description="RuntimeClass (e.g. nvidia, kata)."
    )
    dns_config: DnsConfig | None = Field(None, description="DNS options, nameservers, searches.")
    security_context: PodSecurityContext | None = Field(
        None,
        description="Pod security context, merged key by key over the operator's (held to "
        "restricted).",
    )
    # The operator's: declared so that both mjob validate and the apiserver refuse them by name
    # (an undeclared field would be pruned without a word).
    restart_policy: Text | None = Field(None, description="The operator's: refused.")
    hostname: Text | None = Field(None, description="The operator's: refused.")
    subdomain: Text | None = Field(None, description="The operator's: refused.")
    service_account_name: Text | None = Field(None, description="The operator's: refused.")
    service_account: Text | None = Field(None, description="The operator's: refused.")
    node_name: Text | None = Field(None, description="The operator's: refused.")
    termination_grace_period_seconds: int | None = Field(
        None, ge=0, le=MAX_DURATION_SECONDS, description="The operator's: refused."
    )
    priority_class_name: Text | None = Field(None, description="The operator's: refused.")

    @field_validator(
        "restart_policy",
        "hostname",
        "subdomain",
        "service_account_name",
        "service_account",
        "node_name",
        "termination_grace_period_seconds",
        "priority_class_name",
    )
    @classmethod
    def _owned(cls, value: object, info: ValidationInfo) -> object:
        if value is not None:
            camel = to_camel(info.field_name or "")
            raise ValueError(f"set by the operator: {OWNED_POD_FIELDS[camel]}")
        return value

    @model_validator(mode="after")
    def _names(self) -> TemplatePodSpec:
        _unique([v.name for v in self.volumes or []], "volume")
        _unique([s.name for s in self.image_pull_secrets or []], "imagePullSecret")
        names = [c.name for c in [*(self.init_containers or []), *(self.containers or [])]]
        _unique(names, "container")
        return self

    @field_validator("init_containers")
    @classmethod
    def _no_trainer(cls, value: list[Container] | None) -> list[Container] | None:
        if any(c.name == TRAINER_CONTAINER for c in value or []):
            raise ValueError(
                f"{TRAINER_CONTAINER!r} is the trainer container: it runs in containers"
            )
        if any(c.name == LAUNCHER_INIT_CONTAINER for c in value or []):
            raise ValueError(LAUNCHER_WHY)
        return value


# The template's budget: every pod of the job carries it, in etcd, in every watcher and in each
# create call, so 1,024 pods multiply it. The CRD bounds each field; this bounds the whole, before
# the operator plans anything (the apiserver itself takes a job of up to 1.5 MB). A rich template
# (tests/unit/template_cases.py FULL_TEMPLATE) holds about 150 values and 3 KB.
MAX_TEMPLATE_VALUES: Final = 4096
MAX_TEMPLATE_BYTES: Final = 64 * 1024


def _weigh(value: Any, path: str, depth: int, out: list[tuple[int, int, str]]) -> tuple[int, int]:
    """(JSON values, about its JSON bytes) under `value`; the same for each node down to
    `depth`, with its path, in `out`."""
    if isinstance(value, dict):
        n, size = 1, 2
        for k, v in value.items():
            vn, vs = _weigh(v, f"{path}.{k}", depth - 1, out)
            n, size = n + vn, size + vs + len(str(k)) + 4
    elif isinstance(value, list):
        n, size = 1, 2
        for i, v in enumerate(value):
            vn, vs = _weigh(v, f"{path}[{i}]", depth - 1, out)
            n, size = n + vn, size + vs + 1
    else:
        n, size = 1, len(str(value)) + 2
    if depth > 0:
        out.append((n, size, path))
    return n, size


def template_size_problem(raw: Any, path: str = "spec.template") -> str | None:
    """Why a template (as JSON data) is over the budget, naming where most of it is; or None."""
    nodes: list[tuple[int, int, str]] = []
    values, _ = _weigh(raw, path, 6, nodes)
    size = len(json.dumps(raw, separators=(",", ":"), ensure_ascii=False).encode())
    if values <= MAX_TEMPLATE_VALUES and size <= MAX_TEMPLATE_BYTES:
        return None
    # The deepest node holding at least half of what is over: the field to shrink.
    by_values = values > MAX_TEMPLATE_VALUES
    total = values if by_values else nodes[-1][1]  # the root is the last node weighed
    heavy = max(
        (n for n in nodes if (n[0] if by_values else n[1]) * 2 >= total),
        key=lambda n: n[2].count(".") + n[2].count("["),
    )
    return (
        f"the template holds {values:,} values and {size:,} bytes ({heavy[2]}: {heavy[0]:,} "
        f"values, about {heavy[1]:,} bytes); a template may hold at most "
        f"{MAX_TEMPLATE_VALUES:,} values and {MAX_TEMPLATE_BYTES // 1024} KiB of JSON, since every "
        "pod of the job carries it: move large content into a ConfigMap or Secret and mount it"
    )


class PodTemplate(ApiModel):
    """An overlay on every pod of the job (see docs/api.md, spec.template)."""

    metadata: TemplateMetadata | None = Field(None, description="Pod labels and annotations.")
    spec: TemplatePodSpec | None = Field(None, description="Pod fields.")

    @model_validator(mode="before")
    @classmethod
    def _budget(cls, data: Any) -> Any:
        # Before the fields are read: an oversized template costs one walk, not its models.
        if isinstance(data, dict):
            problem = template_size_problem(data)
            if problem:
                raise ValueError(problem)
        return data
