"""`MegatronJobDefaults` (megatron.dev/v1alpha1): what a platform team writes once for every job.

A platform's conventions (its trainer image, NCCL env, pull secrets, tolerations, node selector,
fabric, Multus annotations, pod identity, cloud identity for checkpoints) would otherwise be
repeated in every MegatronJob, as Kubeflow's ClusterTrainingRuntime spares its TrainJobs. Two
places hold them, merged in this order, each under the next:

1. the operator's own defaults (`mjob operator --job-defaults FILE`; the chart's `jobDefaults`
   and `trainerImage` values): every job the operator runs;
2. every MegatronJobDefaults object in the job's namespace, in name order: that namespace's jobs;
3. the job's own spec, which always wins.

The fields mirror the job's own paths (`env`, `resources.tolerations`, `template`, ...), so a
default is merged under exactly the field it fills, with the same rules: the merged spec is
validated as a job's own would be (the operator's env names, pod fields and labels refused), and
the CRD checks a defaults object with the job's CEL rules. Two fields exist only here:
`serviceAccount.annotations` (each job's trainer ServiceAccount: EKS IRSA, GKE Workload
Identity) and `podSecurityContext` (the trainer pods' fixed uid, gid and fsGroup, which OpenShift
assigns itself).

The operator resolves a job's defaults once, when it first sees the job, and records them in
`status.defaults`: a later change of the defaults applies to new jobs, never to a running one's
next attempt.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field

from megatron_contract.bounds import MAX_DURATION_SECONDS

from .base import (
    ApiModel,
    DnsSubdomain,
    LabelKey,
    LabelValue,
    Quantity,
    Seconds,
    Toleration,
)
from .spec import EnvVar, NetworkSpec
from .template import PodTemplate

KIND: Final = "MegatronJobDefaults"
PLURAL: Final = "megatronjobdefaults"
SINGULAR: Final = "megatronjobdefaults"
SHORT_NAMES: Final = ("mjd",)
OPERATOR_SOURCE: Final = "operator"  # status.defaults.sources entry of the operator's own file
MAX_ANNOTATIONS: Final = 64
MAX_SOURCES: Final = 32
# The trainer pods' identity when no defaults say otherwise: the images' USER.
DEFAULT_UID: Final = 1000


class ServiceAccountDefaults(ApiModel):
    """Each job's trainer ServiceAccount (`<job>-trainer`)."""

    annotations: dict[LabelKey, str] = Field(
        default_factory=dict,
        max_length=MAX_ANNOTATIONS,
        description="Annotations on it: eks.amazonaws.com/role-arn (EKS IRSA), "
        "iam.gke.io/gcp-service-account (GKE Workload Identity), so that msc:// checkpoints "
        "need no static keys.",
    )


class PodIdentity(ApiModel):
    """The trainer pods' fixed identity. Every field left out is left to the platform."""

    run_as_user: int | None = Field(
        None, ge=1, le=2**31 - 1, description="runAsUser of every trainer pod (never 0)."
    )
    run_as_group: int | None = Field(
        None, ge=0, le=2**31 - 1, description="runAsGroup of every trainer pod."
    )
    fs_group: int | None = Field(
        None,
        ge=0,
        le=2**31 - 1,
        description="fsGroup of every trainer pod: the group that may write the checkpoint volume.",
    )


class DefaultsResources(ApiModel):
    """Defaults of spec.resources: merged key by key under the job's own."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        max_length=32,
        description="Requests per pod for the keys the job does not set, e.g. cpu and memory: "
        "a pod without requests is BestEffort, the first evicted.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, max_length=32, description="Limits per pod, likewise."
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="Node labels, under the job's own."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Added to the job's tolerations."
    )
    network: NetworkSpec | None = Field(
        None,
        description="The fabric, for a job that leaves resources.network at its default "
        "(fabric none).",
    )


class MegatronJobDefaultsSpec(ApiModel):
    """Defaults merged under every job's spec in scope (see docs/api.md, MegatronJobDefaults)."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="Trainer image of a job that names none (spec.image).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        None, description="Pull policy of a job that leaves spec.imagePullPolicy at its default."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Trainer environment (e.g. NCCL_*), under the job's env by name.",
    )
    priority_class_name: DnsSubdomain | None = Field(
        None, description="PriorityClass of a job that names none."
    )
    active_deadline_seconds: Seconds | None = Field(
        None,
        ge=1,
        description="Wall-clock limit of a job that sets none (spec.activeDeadlineSeconds). At "
        f"most {MAX_DURATION_SECONDS} s.",
    )
    resources: DefaultsResources | None = Field(
        None, description="Requests, limits, node selector, tolerations and fabric."
    )
    template: PodTemplate | None = Field(
        None,
        description="Pod conventions (labels, annotations such as Multus networks, image pull "
        "secrets, volumes, sidecars, scheduling, security context), merged under the job's "
        "spec.template: maps key by key, lists by name.",
    )
    service_account: ServiceAccountDefaults | None = Field(
        None, description="Each job's trainer ServiceAccount (only here, not in a job)."
    )
    launcher_image: str | None = Field(
        None,
        min_length=1,
        max_length=1024,
        description="The image whose init container gives a trainer.command job's pods the "
        "launcher (the operator's own image; the chart sets its image). Only the operator's "
        "own defaults (--job-defaults) may set it, not a MegatronJobDefaults.",
    )
    pod_security_context: PodIdentity | None = Field(
        None,
        description="The trainer pods' runAsUser, runAsGroup and fsGroup (only here, not in a "
        f"job). Unset: {DEFAULT_UID} for all three, the images' user. An empty object: none, "
        "for platforms that assign them (OpenShift's restricted-v2 SCC). The most specific "
        "defaults that set it win whole.",
    )


class AppliedDefaults(ApiModel):
    """status.defaults: the defaults the operator merged under the job's spec."""

    sources: list[str] = Field(
        default_factory=list,
        max_length=MAX_SOURCES,
        description="Where they came from, least specific first: `operator` (its own "
        "defaults), then namespace/name of each MegatronJobDefaults.",
    )
    spec: dict[str, Any] | None = Field(
        None,
        description="Their merged fields (a MegatronJobDefaults spec), as resolved when the "
        "job was first seen: later changes apply to new jobs only.",
        json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    )
