"""The Kubernetes (core/v1) objects a pod template carries, as bounded schemas.

A template's nested objects (an affinity, a probe, a security context, DNS options) were once kept
whole (`x-kubernetes-preserve-unknown-fields`), so one job could store a 0.9 MB list in them, and
the operator paid for it in every pod it rendered. Here each is declared field by field as in the
Kubernetes 1.34 API (tests/unit/test_podtypes.py compares them with the upstream schema), with a
cap on every list, map and string, so the apiserver refuses an oversized template when it is
created. The caps follow Kubernetes' own where it has them (3 nameservers, 32 search domains) and
sit far above what a pod needs elsewhere.

Security fields carry the restricted Pod Security rules (templates.py applies them to every
container of the job's pods, api/cel.py states the same with CEL).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator

from .base import ApiModel, DnsSubdomain, LabelKey, LabelValue, Quantity

MAX_TERMS: Final = 8  # affinity terms of one kind
MAX_SMALL: Final = 16  # most nested lists and maps
MAX_VALUES: Final = 64  # a selector requirement's values, a volume's items
MAX_KEY: Final = 253
MAX_TEXT: Final = 4096
MAX_UID: Final = 2**31 - 1  # Kubernetes' range of a Linux uid or gid
MAX_PORT: Final = 65535
MAX_MODE: Final = 0o777
MAX_PROBE_SECONDS: Final = 86400

Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY)]
Short = Annotated[str, Field(max_length=MAX_KEY)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
Uid = Annotated[int, Field(ge=0, le=MAX_UID)]
Port = Annotated[int, Field(ge=1, le=MAX_PORT)]
Mode = Annotated[int, Field(ge=0, le=MAX_MODE)]
ProbeSeconds = Annotated[int, Field(ge=0, le=MAX_PROBE_SECONDS)]
Weight = Annotated[int, Field(ge=1, le=100)]
PORT_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def _check_int_or_port_name(value: object) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PORT:
        return value
    if isinstance(value, str) and 1 <= len(value) <= 15:
        return value
    raise ValueError(
        f"must be a port number (1-{MAX_PORT}) or a port name of at most 15 characters"
    )


PortOrName = Annotated[
    int | str,
    BeforeValidator(_check_int_or_port_name),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "minimum": 1, "maximum": MAX_PORT, "maxLength": 15}
    ),
]

# The restricted Pod Security level, as the template rules state it (api/cel.py says the same).
RESTRICTED: Final = (
    "the job's pods are held to the restricted Pod Security level (plus IPC_LOCK for RDMA), "
    "whatever the namespace's level"
)
ALLOWED_CAPABILITIES: Final = ("NET_BIND_SERVICE", "IPC_LOCK")
SAFE_SYSCTLS: Final = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)
SELINUX_TYPES: Final = (
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
)
# Each refusal: (field, why). The CEL rules carry the same sentences.
WHY: Final[dict[str, str]] = {
    "privileged": f"privileged containers are refused: {RESTRICTED}",
    "allowPrivilegeEscalation": f"allowPrivilegeEscalation must be false: {RESTRICTED}",
    "runAsUser": f"runAsUser 0 (root) is refused: {RESTRICTED}",
    "runAsNonRoot": f"runAsNonRoot false is refused: {RESTRICTED}",
    "capabilities": "capabilities.add may name only "
    + " and ".join(ALLOWED_CAPABILITIES)
    + f": {RESTRICTED}",
    "procMount": f"procMount Unmasked is refused: {RESTRICTED}",
    "seccompProfile": f"seccompProfile Unconfined is refused: {RESTRICTED}",
    "appArmorProfile": f"appArmorProfile Unconfined is refused: {RESTRICTED}",
    "seLinuxOptions": "seLinuxOptions may set only level and a container type ("
    + ", ".join(t for t in SELINUX_TYPES if t)
    + f"): {RESTRICTED}",
    "hostProcess": f"windowsOptions.hostProcess is refused: {RESTRICTED}",
    "sysctls": "only the namespaced safe sysctls are allowed ("
    + ", ".join(SAFE_SYSCTLS)
    + f"): {RESTRICTED}",
    "hostPort": f"hostPort and hostIP are refused (they open a port of the node): {RESTRICTED}",
    "mountPropagation": f"mountPropagation Bidirectional is refused: {RESTRICTED}",
    "host": "a probe or hook may not name a host: the kubelet would connect from the node to "
    "any address (give none: the pod's own IP)",
}


def _refuse(condition: bool, field: str) -> None:
    if condition:
        raise ValueError(WHY[field])


# --- selectors and affinity ------------------------------------------------------------------


class LabelSelectorRequirement(ApiModel):
    """A label key, an operator and values."""

    key: Key = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="The operator.")
    values: list[Short] | None = Field(None, max_length=MAX_VALUES, description="The values.")


class LabelSelector(ApiModel):
    """core/v1 LabelSelector: labels to match."""

    match_labels: dict[LabelKey, LabelValue] | None = Field(
        None, max_length=MAX_SMALL, description="Labels that must all match."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        None, max_length=MAX_SMALL, description="Requirements that must all hold."
    )


class NodeSelectorRequirement(ApiModel):
    """A node label (or field) key, an operator and values."""

    key: Key = Field(description="The node label key (metadata.name for matchFields).")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="The operator."
    )
    values: list[Short] | None = Field(None, max_length=MAX_VALUES, description="The values.")


class NodeSelectorTerm(ApiModel):
    """Node requirements that must all hold."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        None, max_length=MAX_SMALL, description="Requirements on node labels."
    )
    match_fields: list[NodeSelectorRequirement] | None = Field(
        None, max_length=MAX_SMALL, description="Requirements on node fields."
    )


class NodeSelector(ApiModel):
    """Terms of which one must hold."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        max_length=MAX_TERMS, description="The terms (ORed)."
    )


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: Weight = Field(description="Weight, 1-100.")
    preference: NodeSelectorTerm = Field(description="The preferred nodes.")


class NodeAffinity(ApiModel):
    """Which nodes the pods may or prefer to run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        None, description="Nodes the pods must run on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = (
        Field(None, max_length=MAX_TERMS, description="Nodes the pods prefer.")
    )


CROSS_NAMESPACE_WHY: Final = (
    "pod affinity terms apply to the job's own namespace: a term over other namespaces "
    "(a required anti-affinity above all) would hold other tenants' pods off the nodes; remove "
    "namespaces and namespaceSelector"
)


class PodAffinityTerm(ApiModel):
    """Pods (of the job's namespace) whose topology domain the pods join or avoid."""

    label_selector: LabelSelector | None = Field(None, description="The pods.")
    namespaces: list[DnsSubdomain] | None = Field(
        None,
        max_length=MAX_SMALL,
        description="Refused: the terms apply to the job's own namespace.",
    )
    namespace_selector: LabelSelector | None = Field(
        None, description="Refused: the terms apply to the job's own namespace."
    )
    topology_key: Key = Field(description="The node label naming the domain.")
    match_label_keys: list[Key] | None = Field(
        None, max_length=MAX_SMALL, description="Label keys matched with this pod's values."
    )
    mismatch_label_keys: list[Key] | None = Field(
        None, max_length=MAX_SMALL, description="Label keys mismatched with this pod's values."
    )

    @field_validator("namespaces", "namespace_selector")
    @classmethod
    def _own_namespace(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(CROSS_NAMESPACE_WHY)
        return value


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod affinity term."""

    weight: Weight = Field(description="Weight, 1-100.")
    pod_affinity_term: PodAffinityTerm = Field(description="The term.")


class PodAffinity(ApiModel):
    """Pod (anti-)affinity terms, added to the operator's."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        None, max_length=MAX_TERMS, description="Terms that must hold."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = (
        Field(None, max_length=MAX_TERMS, description="Terms preferred.")
    )


class Affinity(ApiModel):
    """core/v1 Affinity: nodeAffinity as given; pod terms added to the operator's."""

    node_affinity: NodeAffinity | None = Field(None, description="Node affinity.")
    pod_affinity: PodAffinity | None = Field(None, description="Pod affinity terms.")
    pod_anti_affinity: PodAffinity | None = Field(None, description="Pod anti-affinity terms.")


# --- DNS -------------------------------------------------------------------------------------


class DnsOption(ApiModel):
    """A resolver option."""

    name: Short | None = Field(None, description="Option name, e.g. ndots.")
    value: Short | None = Field(None, description="Option value.")


class DnsConfig(ApiModel):
    """core/v1 PodDNSConfig: nameservers, search domains and resolver options."""

    nameservers: list[Short] | None = Field(None, max_length=3, description="Nameserver IPs.")
    searches: list[Short] | None = Field(None, max_length=32, description="Search domains.")
    options: list[DnsOption] | None = Field(
        None, max_length=MAX_SMALL, description="Resolver options."
    )


# --- security contexts -----------------------------------------------------------------------


class SeLinuxOptions(ApiModel):
    """SELinux labels."""

    user: Short | None = Field(None, description="Refused (restricted).")
    role: Short | None = Field(None, description="Refused (restricted).")
    type: Short | None = Field(None, description="A container type, e.g. container_t.")
    level: Short | None = Field(None, description="The level, e.g. s0:c123,c456.")

    @field_validator("user", "role")
    @classmethod
    def _no_user_role(cls, value: str | None) -> str | None:
        _refuse(bool(value), "seLinuxOptions")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str | None) -> str | None:
        _refuse(value is not None and value not in SELINUX_TYPES, "seLinuxOptions")
        return value


class SeccompProfile(ApiModel):
    """The seccomp profile (Unconfined is refused)."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description="Profile type.")
    localhost_profile: Text | None = Field(None, description="Profile file (Localhost).")

    @field_validator("type")
    @classmethod
    def _confined(cls, value: str) -> str:
        _refuse(value == "Unconfined", "seccompProfile")
        return value


class AppArmorProfile(ApiModel):
    """The AppArmor profile (Unconfined is refused)."""

    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(description="Profile type.")
    localhost_profile: Text | None = Field(None, description="Profile name (Localhost).")

    @field_validator("type")
    @classmethod
    def _confined(cls, value: str) -> str:
        _refuse(value == "Unconfined", "appArmorProfile")
        return value


class WindowsOptions(ApiModel):
    """Windows settings (hostProcess is refused)."""

    gmsa_credential_spec_name: Short | None = Field(None, description="GMSA spec name.")
    gmsa_credential_spec: Annotated[str, Field(max_length=65536)] | None = Field(
        None, description="GMSA spec."
    )
    run_as_user_name: Short | None = Field(None, description="User name.")
    host_process: bool | None = Field(None, description="Refused (restricted).")

    @field_validator("host_process")
    @classmethod
    def _no_host(cls, value: bool | None) -> bool | None:
        _refuse(value is True, "hostProcess")
        return value


class Sysctl(ApiModel):
    """A namespaced sysctl (only the safe set)."""

    name: Key = Field(description="Sysctl name.")
    value: Short = Field(description="Value.")

    @field_validator("name")
    @classmethod
    def _safe(cls, value: str) -> str:
        _refuse(value not in SAFE_SYSCTLS, "sysctls")
        return value


def _root(value: int | None, field: str = "runAsUser") -> int | None:
    _refuse(value == 0, field)
    return value


class PodSecurityContext(ApiModel):
    """core/v1 PodSecurityContext, merged key by key over the operator's (uid 1000, non-root,
    RuntimeDefault seccomp); what the restricted level forbids is refused."""

    run_as_user: Uid | None = Field(None, description="uid (not 0).")
    run_as_group: Uid | None = Field(None, description="gid.")
    run_as_non_root: bool | None = Field(None, description="Must stay true.")
    supplemental_groups: list[Uid] | None = Field(
        None, max_length=32, description="More gids of the processes."
    )
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        None, description="How supplementalGroups combine with the image's groups."
    )
    fs_group: Uid | None = Field(None, description="gid owning the volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        None, description="When the kubelet chowns the volumes."
    )
    se_linux_options: SeLinuxOptions | None = Field(None, description="SELinux labels.")
    se_linux_change_policy: Literal["Recursive", "MountOption"] | None = Field(
        None, description="How volumes get their SELinux label."
    )
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp profile.")
    app_armor_profile: AppArmorProfile | None = Field(None, description="AppArmor profile.")
    sysctls: list[Sysctl] | None = Field(
        None, max_length=MAX_SMALL, description="Namespaced safe sysctls."
    )
    windows_options: WindowsOptions | None = Field(None, description="Windows settings.")

    @field_validator("run_as_user")
    @classmethod
    def _user(cls, value: int | None) -> int | None:
        return _root(value)

    @field_validator("run_as_non_root")
    @classmethod
    def _non_root(cls, value: bool | None) -> bool | None:
        _refuse(value is False, "runAsNonRoot")
        return value


class Capabilities(ApiModel):
    """Capabilities added (NET_BIND_SERVICE, IPC_LOCK) and dropped (ALL is always dropped)."""

    add: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=MAX_SMALL, description="Added: only " + ", ".join(ALLOWED_CAPABILITIES)
    )
    drop: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=MAX_SMALL, description="Dropped (the operator adds ALL)."
    )

    @field_validator("add")
    @classmethod
    def _allowed(cls, value: list[str] | None) -> list[str] | None:
        _refuse(any(c not in ALLOWED_CAPABILITIES for c in value or []), "capabilities")
        return value


class SecurityContext(ApiModel):
    """core/v1 SecurityContext of an init or sidecar container, held to restricted: no
    privilege, no escalation, not root, confined; the operator sets allowPrivilegeEscalation
    false and drops ALL capabilities where the template does not."""

    privileged: bool | None = Field(None, description="Refused (restricted).")
    allow_privilege_escalation: bool | None = Field(None, description="Must be false.")
    capabilities: Capabilities | None = Field(None, description="Capabilities.")
    run_as_user: Uid | None = Field(None, description="uid (not 0).")
    run_as_group: Uid | None = Field(None, description="gid.")
    run_as_non_root: bool | None = Field(None, description="Must stay true.")
    read_only_root_filesystem: bool | None = Field(None, description="Read-only root.")
    proc_mount: Literal["Default", "Unmasked"] | None = Field(
        None, description="Unmasked is refused."
    )
    se_linux_options: SeLinuxOptions | None = Field(None, description="SELinux labels.")
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp profile.")
    app_armor_profile: AppArmorProfile | None = Field(None, description="AppArmor profile.")
    windows_options: WindowsOptions | None = Field(None, description="Windows settings.")

    @field_validator("privileged")
    @classmethod
    def _unprivileged(cls, value: bool | None) -> bool | None:
        _refuse(value is True, "privileged")
        return value

    @field_validator("allow_privilege_escalation")
    @classmethod
    def _no_escalation(cls, value: bool | None) -> bool | None:
        _refuse(value is True, "allowPrivilegeEscalation")
        return value

    @field_validator("run_as_user")
    @classmethod
    def _user(cls, value: int | None) -> int | None:
        return _root(value)

    @field_validator("run_as_non_root")
    @classmethod
    def _non_root(cls, value: bool | None) -> bool | None:
        _refuse(value is False, "runAsNonRoot")
        return value

    @field_validator("proc_mount")
    @classmethod
    def _masked(cls, value: str | None) -> str | None:
        _refuse(value == "Unmasked", "procMount")
        return value


# --- probes and hooks ------------------------------------------------------------------------


class ExecAction(ApiModel):
    """A command run in the container."""

    command: list[Text] | None = Field(None, max_length=MAX_VALUES, description="The command.")


class HttpHeader(ApiModel):
    """A request header."""

    name: Key = Field(description="Header name.")
    value: Text = Field(description="Header value.")


def _no_host(value: str | None) -> str | None:
    _refuse(bool(value), "host")
    return value


class HttpGetAction(ApiModel):
    """An HTTP GET to the pod."""

    path: Text | None = Field(None, description="Path.")
    port: PortOrName = Field(description="Port number or name.")
    host: Short | None = Field(None, description="Refused: the request goes to the pod's IP.")
    scheme: Literal["HTTP", "HTTPS"] | None = Field(None, description="Scheme.")
    http_headers: list[HttpHeader] | None = Field(
        None, max_length=MAX_SMALL, description="Request headers."
    )

    @field_validator("host")
    @classmethod
    def _pod_only(cls, value: str | None) -> str | None:
        return _no_host(value)


class TcpSocketAction(ApiModel):
    """A TCP connection to the pod."""

    port: PortOrName = Field(description="Port number or name.")
    host: Short | None = Field(None, description="Refused: the connection goes to the pod's IP.")

    @field_validator("host")
    @classmethod
    def _pod_only(cls, value: str | None) -> str | None:
        return _no_host(value)


class GrpcAction(ApiModel):
    """A gRPC health check."""

    port: Port = Field(description="Port number.")
    service: Short | None = Field(None, description="Service name.")


class SleepAction(ApiModel):
    """A pause."""

    seconds: ProbeSeconds = Field(description="Seconds to sleep.")


class Probe(ApiModel):
    """core/v1 Probe: one action and its timing."""

    exec: ExecAction | None = Field(None, description="Run a command.")
    http_get: HttpGetAction | None = Field(None, description="An HTTP GET.")
    tcp_socket: TcpSocketAction | None = Field(None, description="A TCP connect.")
    grpc: GrpcAction | None = Field(None, description="A gRPC health check.")
    initial_delay_seconds: ProbeSeconds | None = Field(None, description="Delay before the first.")
    timeout_seconds: ProbeSeconds | None = Field(None, description="Timeout of one probe.")
    period_seconds: ProbeSeconds | None = Field(None, description="Interval.")
    success_threshold: ProbeSeconds | None = Field(None, description="Successes to pass.")
    failure_threshold: ProbeSeconds | None = Field(None, description="Failures to fail.")
    termination_grace_period_seconds: ProbeSeconds | None = Field(
        None, description="Grace period on a failed liveness probe."
    )


class LifecycleHandler(ApiModel):
    """A hook's action."""

    exec: ExecAction | None = Field(None, description="Run a command.")
    http_get: HttpGetAction | None = Field(None, description="An HTTP GET.")
    tcp_socket: TcpSocketAction | None = Field(None, description="A TCP connect (deprecated).")
    sleep: SleepAction | None = Field(None, description="A pause.")


class Lifecycle(ApiModel):
    """core/v1 Lifecycle: postStart and preStop hooks."""

    post_start: LifecycleHandler | None = Field(None, description="After the container starts.")
    pre_stop: LifecycleHandler | None = Field(None, description="Before it is stopped.")
    stop_signal: Annotated[str, Field(max_length=16, pattern=r"^SIG[A-Z0-9+]+$")] | None = Field(
        None, description="The signal that stops it, e.g. SIGTERM."
    )


# --- other container parts -------------------------------------------------------------------


class ContainerPort(ApiModel):
    """A port the container listens on (no hostPort: it would open a port of the node)."""

    name: Annotated[str, Field(max_length=15, pattern=PORT_NAME_PATTERN)] | None = Field(
        None, description="Port name."
    )
    container_port: Port = Field(description="Port number.")
    protocol: Literal["TCP", "UDP", "SCTP"] | None = Field(None, description="Protocol.")
    host_port: Annotated[int, Field(ge=0, le=MAX_PORT)] | None = Field(
        None, description="Refused (restricted)."
    )
    host_ip: Short | None = Field(None, alias="hostIP", description="Refused (restricted).")

    @field_validator("host_port")
    @classmethod
    def _no_host_port(cls, value: int | None) -> int | None:
        _refuse(bool(value), "hostPort")
        return value

    @field_validator("host_ip")
    @classmethod
    def _no_host_ip(cls, value: str | None) -> str | None:
        _refuse(bool(value), "hostPort")
        return value


class NameRef(ApiModel):
    """A Secret or ConfigMap of the job's namespace."""

    name: Short | None = Field(None, description="Its name.")
    optional: bool | None = Field(None, description="Start even when it does not exist.")


class EnvFromSource(ApiModel):
    """Every key of a Secret or ConfigMap as env vars."""

    prefix: Short | None = Field(None, description="Prefix of each variable's name.")
    config_map_ref: NameRef | None = Field(None, description="The ConfigMap.")
    secret_ref: NameRef | None = Field(None, description="The Secret.")


class VolumeDevice(ApiModel):
    """A raw block device from a claim."""

    name: Key = Field(description="The volume.")
    device_path: Text = Field(description="Path in the container.")


class ResizePolicy(ApiModel):
    """How a resource is resized in place."""

    resource_name: Key = Field(description="cpu or memory.")
    restart_policy: Literal["NotRequired", "RestartContainer"] = Field(description="Restart?")


class ResourceClaimRef(ApiModel):
    """A dynamic resource claim of the pod that this container uses."""

    name: Key = Field(description="The pod's claim.")
    request: Short | None = Field(None, description="One request of it.")


__all__ = [
    "Affinity",
    "Capabilities",
    "ContainerPort",
    "DnsConfig",
    "EnvFromSource",
    "LabelSelector",
    "Lifecycle",
    "PodSecurityContext",
    "Probe",
    "Quantity",
    "ResizePolicy",
    "ResourceClaimRef",
    "SecurityContext",
    "VolumeDevice",
]
