"""The volume sources a template's volume may use (core/v1, Kubernetes 1.34), as bounded schemas.

Declared field by field, as podtypes.py declares the pod's other objects: a volume source kept
whole could hold megabytes (a CSI driver's attributes, a flexVolume's options), which the
operator would copy into every pod. Which sources a cluster allows is the chart's admission
policy's choice (`admissionPolicy.template.allowedVolumeTypes`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import ApiModel, DnsSubdomain, LabelKey, Quantity
from .podtypes import MAX_SMALL, MAX_VALUES, Key, LabelSelector, Mode, Short, Text

Partition = Annotated[int, Field(ge=0, le=255)]
Lun = Annotated[int, Field(ge=0, le=255)]


class LocalRef(ApiModel):
    """An object of the job's namespace, by name."""

    name: Short | None = Field(None, description="Its name.")


class KeyToPath(ApiModel):
    """A key of a Secret or ConfigMap, as a file."""

    key: Key = Field(description="The key.")
    path: Text = Field(description="Relative file path.")
    mode: Mode | None = Field(None, description="File mode.")


class PersistentVolumeClaimSource(ApiModel):
    """A claim of the job's namespace."""

    claim_name: DnsSubdomain = Field(description="The claim.")
    read_only: bool | None = Field(None, description="Mount read-only.")


class ConfigMapSource(ApiModel):
    """A ConfigMap's keys as files."""

    name: Short | None = Field(None, description="The ConfigMap.")
    items: list[KeyToPath] | None = Field(None, max_length=MAX_VALUES, description="Keys.")
    default_mode: Mode | None = Field(None, description="File mode.")
    optional: bool | None = Field(None, description="Start without it.")


class SecretSource(ApiModel):
    """A Secret's keys as files."""

    secret_name: Short | None = Field(None, description="The Secret.")
    items: list[KeyToPath] | None = Field(None, max_length=MAX_VALUES, description="Keys.")
    default_mode: Mode | None = Field(None, description="File mode.")
    optional: bool | None = Field(None, description="Start without it.")


class EmptyDirSource(ApiModel):
    """A scratch directory that lives as long as the pod."""

    medium: Annotated[str, Field(max_length=64)] | None = Field(
        None, description="'' (the node's disk) or Memory."
    )
    size_limit: Quantity | None = Field(None, description="Size limit.")


class ObjectFieldRef(ApiModel):
    """A field of the pod."""

    api_version: Annotated[str, Field(max_length=64)] | None = Field(None, description="Version.")
    field_path: Text = Field(description="The field.")


class ResourceFieldRef(ApiModel):
    """A container's resource request or limit."""

    container_name: Short | None = Field(None, description="Container.")
    resource: Key = Field(description="e.g. limits.cpu.")
    divisor: Quantity | None = Field(None, description="Divisor.")


class DownwardApiFile(ApiModel):
    """A file holding a field of the pod."""

    path: Text = Field(description="Relative file path.")
    field_ref: ObjectFieldRef | None = Field(None, description="A pod field.")
    resource_field_ref: ResourceFieldRef | None = Field(None, description="A resource.")
    mode: Mode | None = Field(None, description="File mode.")


class DownwardApiSource(ApiModel):
    """Pod fields as files."""

    items: list[DownwardApiFile] | None = Field(None, max_length=MAX_VALUES, description="Files.")
    default_mode: Mode | None = Field(None, description="File mode.")


class KeysProjection(ApiModel):
    """A Secret's or ConfigMap's keys in a projected volume."""

    name: Short | None = Field(None, description="The object.")
    items: list[KeyToPath] | None = Field(None, max_length=MAX_VALUES, description="Keys.")
    optional: bool | None = Field(None, description="Start without it.")


class DownwardApiProjection(ApiModel):
    """Pod fields in a projected volume."""

    items: list[DownwardApiFile] | None = Field(None, max_length=MAX_VALUES, description="Files.")


class TokenProjection(ApiModel):
    """A ServiceAccount token for an audience."""

    audience: Short | None = Field(None, description="Audience.")
    expiration_seconds: Annotated[int, Field(ge=600, le=2**32)] | None = Field(
        None, description="Lifetime."
    )
    path: Text = Field(description="Relative file path.")


class TrustBundleProjection(ApiModel):
    """ClusterTrustBundles as a file."""

    name: Short | None = Field(None, description="One bundle by name.")
    signer_name: Short | None = Field(None, description="Bundles of a signer.")
    label_selector: LabelSelector | None = Field(None, description="Bundles by label.")
    optional: bool | None = Field(None, description="Start without it.")
    path: Text = Field(description="Relative file path.")


class PodCertificateProjection(ApiModel):
    """A certificate for the pod from a signer."""

    signer_name: Short = Field(description="The signer.")
    key_type: Annotated[str, Field(max_length=64)] = Field(description="Key type.")
    max_expiration_seconds: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = Field(
        None, description="Longest lifetime."
    )
    credential_bundle_path: Text | None = Field(None, description="Key and chain file.")
    key_path: Text | None = Field(None, description="Key file.")
    certificate_chain_path: Text | None = Field(None, description="Chain file.")


class VolumeProjection(ApiModel):
    """One source of a projected volume."""

    secret: KeysProjection | None = Field(None, description="A Secret's keys.")
    config_map: KeysProjection | None = Field(None, description="A ConfigMap's keys.")
    downward_api: DownwardApiProjection | None = Field(
        None, alias="downwardAPI", description="Pod fields."
    )
    service_account_token: TokenProjection | None = Field(None, description="A token.")
    cluster_trust_bundle: TrustBundleProjection | None = Field(None, description="CA bundles.")
    pod_certificate: PodCertificateProjection | None = Field(None, description="A certificate.")


class ProjectedSource(ApiModel):
    """Several sources in one directory."""

    sources: list[VolumeProjection] | None = Field(
        None, max_length=MAX_SMALL, description="The sources."
    )
    default_mode: Mode | None = Field(None, description="File mode.")


class CsiSource(ApiModel):
    """An inline CSI volume (its driver must allow ephemeral use)."""

    driver: Key = Field(description="The driver.")
    read_only: bool | None = Field(None, description="Read-only.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    volume_attributes: dict[Key, Text] | None = Field(
        None, max_length=MAX_SMALL, description="Driver attributes."
    )
    node_publish_secret_ref: LocalRef | None = Field(None, description="Driver Secret.")


class ClaimResources(ApiModel):
    """A claim's storage request."""

    requests: dict[Key, Quantity] | None = Field(None, max_length=4, description="Requests.")
    limits: dict[Key, Quantity] | None = Field(None, max_length=4, description="Limits.")


class DataSource(ApiModel):
    """What a new claim is filled from."""

    api_group: Short | None = Field(None, description="API group.")
    kind: Short = Field(description="Kind.")
    name: Short = Field(description="Name.")


class DataSourceRef(DataSource):
    """What a new claim is filled from, possibly in another namespace."""

    namespace: Short | None = Field(None, description="Namespace.")


class ClaimSpec(ApiModel):
    """The claim made for each pod."""

    access_modes: list[Annotated[str, Field(max_length=64)]] | None = Field(
        None, max_length=4, description="Access modes."
    )
    selector: LabelSelector | None = Field(None, description="Volumes to bind.")
    resources: ClaimResources | None = Field(None, description="Size.")
    volume_name: Short | None = Field(None, description="A volume to bind by name.")
    storage_class_name: Short | None = Field(None, description="StorageClass.")
    volume_mode: Literal["Filesystem", "Block"] | None = Field(None, description="Mode.")
    data_source: DataSource | None = Field(None, description="Source.")
    data_source_ref: DataSourceRef | None = Field(None, description="Source.")
    volume_attributes_class_name: Short | None = Field(None, description="Attributes class.")


class ClaimMetadata(ApiModel):
    """Labels and annotations of the claim."""

    labels: dict[LabelKey, Short] | None = Field(None, max_length=MAX_SMALL, description="Labels.")
    annotations: dict[LabelKey, Text] | None = Field(
        None, max_length=MAX_SMALL, description="Annotations."
    )


class ClaimTemplate(ApiModel):
    """The claim made for each pod."""

    metadata: ClaimMetadata | None = Field(None, description="Its labels and annotations.")
    spec: ClaimSpec = Field(description="Its spec.")


class EphemeralSource(ApiModel):
    """A claim made for each pod and deleted with it."""

    volume_claim_template: ClaimTemplate | None = Field(None, description="The claim.")


class NfsSource(ApiModel):
    """An NFS export."""

    server: Short = Field(description="Server.")
    path: Text = Field(description="Exported path.")
    read_only: bool | None = Field(None, description="Read-only.")


class ImageSource(ApiModel):
    """An OCI image's content, read-only."""

    reference: Annotated[str, Field(max_length=1024)] | None = Field(
        None, description="Image reference."
    )
    pull_policy: Literal["Always", "Never", "IfNotPresent"] | None = Field(
        None, description="Pull policy."
    )


class HostPathSource(ApiModel):
    """A directory of the node."""

    path: Text = Field(description="Path on the node.")
    type: Annotated[str, Field(max_length=64)] | None = Field(None, description="Type check.")


# In-tree sources (most now served by CSI migration): declared so that they stay bounded.


class AwsEbsSource(ApiModel):
    """An AWS EBS volume."""

    volume_id: Short = Field(alias="volumeID", description="Volume id.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    partition: Partition | None = Field(None, description="Partition.")
    read_only: bool | None = Field(None, description="Read-only.")


class AzureDiskSource(ApiModel):
    """An Azure data disk."""

    disk_name: Short = Field(description="Disk name.")
    disk_uri: Text = Field(alias="diskURI", description="Disk URI.")
    caching_mode: Short | None = Field(None, description="Caching mode.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")
    kind: Short | None = Field(None, description="Kind.")


class AzureFileSource(ApiModel):
    """An Azure File share."""

    secret_name: Short = Field(description="Secret.")
    share_name: Short = Field(description="Share.")
    read_only: bool | None = Field(None, description="Read-only.")


class CephFsSource(ApiModel):
    """A CephFS mount."""

    monitors: list[Short] = Field(max_length=MAX_SMALL, description="Monitors.")
    path: Text | None = Field(None, description="Path.")
    user: Short | None = Field(None, description="User.")
    secret_file: Text | None = Field(None, description="Key file.")
    secret_ref: LocalRef | None = Field(None, description="Key Secret.")
    read_only: bool | None = Field(None, description="Read-only.")


class CinderSource(ApiModel):
    """An OpenStack Cinder volume."""

    volume_id: Short = Field(alias="volumeID", description="Volume id.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")
    secret_ref: LocalRef | None = Field(None, description="Secret.")


class FcSource(ApiModel):
    """A Fibre Channel volume."""

    target_ww_ns: list[Short] | None = Field(
        None, alias="targetWWNs", max_length=MAX_SMALL, description="Target WWNs."
    )
    lun: Lun | None = Field(None, description="LUN.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")
    wwids: list[Short] | None = Field(None, max_length=MAX_SMALL, description="WWIDs.")


class FlexVolumeSource(ApiModel):
    """A flexVolume driver's volume."""

    driver: Key = Field(description="Driver.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    secret_ref: LocalRef | None = Field(None, description="Secret.")
    read_only: bool | None = Field(None, description="Read-only.")
    options: dict[Key, Text] | None = Field(None, max_length=MAX_SMALL, description="Options.")


class FlockerSource(ApiModel):
    """A Flocker dataset."""

    dataset_name: Short | None = Field(None, description="Dataset name.")
    dataset_uuid: Short | None = Field(None, alias="datasetUUID", description="Dataset UUID.")


class GcePdSource(ApiModel):
    """A GCE persistent disk."""

    pd_name: Short = Field(description="Disk.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    partition: Partition | None = Field(None, description="Partition.")
    read_only: bool | None = Field(None, description="Read-only.")


class GitRepoSource(ApiModel):
    """A git repository cloned into the volume (deprecated)."""

    repository: Text = Field(description="Repository URL.")
    revision: Short | None = Field(None, description="Commit.")
    directory: Text | None = Field(None, description="Directory.")


class GlusterfsSource(ApiModel):
    """A GlusterFS mount."""

    endpoints: Short = Field(description="Endpoints.")
    path: Text = Field(description="Volume path.")
    read_only: bool | None = Field(None, description="Read-only.")


class IscsiSource(ApiModel):
    """An iSCSI disk."""

    target_portal: Short = Field(description="Target portal.")
    iqn: Short = Field(description="Target IQN.")
    lun: Lun = Field(description="LUN.")
    iscsi_interface: Short | None = Field(None, description="Interface.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")
    portals: list[Short] | None = Field(None, max_length=MAX_SMALL, description="Portals.")
    chap_auth_discovery: bool | None = Field(None, description="CHAP discovery.")
    chap_auth_session: bool | None = Field(None, description="CHAP session.")
    secret_ref: LocalRef | None = Field(None, description="CHAP Secret.")
    initiator_name: Short | None = Field(None, description="Initiator.")


class PhotonPdSource(ApiModel):
    """A Photon persistent disk."""

    pd_id: Short = Field(alias="pdID", description="Disk id.")
    fs_type: Short | None = Field(None, description="Filesystem.")


class PortworxSource(ApiModel):
    """A Portworx volume."""

    volume_id: Short = Field(alias="volumeID", description="Volume id.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")


class QuobyteSource(ApiModel):
    """A Quobyte volume."""

    registry: Short = Field(description="Registry.")
    volume: Short = Field(description="Volume.")
    read_only: bool | None = Field(None, description="Read-only.")
    user: Short | None = Field(None, description="User.")
    group: Short | None = Field(None, description="Group.")
    tenant: Short | None = Field(None, description="Tenant.")


class RbdSource(ApiModel):
    """A Ceph RBD image."""

    monitors: list[Short] = Field(max_length=MAX_SMALL, description="Monitors.")
    image: Short = Field(description="Image.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    pool: Short | None = Field(None, description="Pool.")
    user: Short | None = Field(None, description="User.")
    keyring: Text | None = Field(None, description="Keyring.")
    secret_ref: LocalRef | None = Field(None, description="Secret.")
    read_only: bool | None = Field(None, description="Read-only.")


class ScaleIoSource(ApiModel):
    """A ScaleIO volume."""

    gateway: Short = Field(description="Gateway.")
    system: Short = Field(description="System.")
    secret_ref: LocalRef = Field(description="Secret.")
    ssl_enabled: bool | None = Field(None, description="TLS.")
    protection_domain: Short | None = Field(None, description="Protection domain.")
    storage_pool: Short | None = Field(None, description="Pool.")
    storage_mode: Short | None = Field(None, description="Mode.")
    volume_name: Short | None = Field(None, description="Volume.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")


class StorageOsSource(ApiModel):
    """A StorageOS volume."""

    volume_name: Short | None = Field(None, description="Volume.")
    volume_namespace: Short | None = Field(None, description="Namespace.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    read_only: bool | None = Field(None, description="Read-only.")
    secret_ref: LocalRef | None = Field(None, description="Secret.")


class VsphereSource(ApiModel):
    """A vSphere disk."""

    volume_path: Text = Field(description="Path.")
    fs_type: Short | None = Field(None, description="Filesystem.")
    storage_policy_name: Short | None = Field(None, description="Policy name.")
    storage_policy_id: Short | None = Field(None, alias="storagePolicyID", description="Policy id.")
