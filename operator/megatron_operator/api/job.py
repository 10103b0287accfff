"""The top-level `MegatronJob` object and its group/version/kind constants."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import GROUP as _GROUP
from .spec import MegatronJobSpec
from .status import MegatronJobStatus

GROUP: Final = _GROUP  # defined in base, beside the label prefixes it also makes
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "MegatronJob"
PLURAL: Final = "megatronjobs"
SINGULAR: Final = "megatronjob"
SHORT_NAMES: Final = ("mj", "mjob")

# Longest job name: the pod hostname "<job>-<node rank>" must stay a DNS label (63) even with
# five-digit node ranks, and Kueue's workload name adds a 6-character suffix.
MAX_NAME_LENGTH: Final = 50
NAME_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(BaseModel):
    """The part of metadata the operator reads; the rest (managedFields, …) passes through."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class MegatronJob(BaseModel):
    """A MegatronJob as read from YAML or from the apiserver."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    api_version: Literal["megatron.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MegatronJob"]
    metadata: ObjectMeta
    spec: MegatronJobSpec
    status: MegatronJobStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace
