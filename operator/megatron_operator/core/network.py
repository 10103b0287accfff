"""What each inter-node fabric adds to a pod (pure): its devices, IPC_LOCK and its env.

docs/networking.md gives the same table with its sources. Only what every cluster of that kind
needs is set: NCCL picks the HCAs, the GID index (NCCL >= 2.21) and the protocol itself, and a
job's spec.env (or the template's trainer env) overrides any of these values.
"""

from __future__ import annotations

from typing import Final

from megatron_operator.api.spec import MegatronJobSpec
from megatron_operator.core.planner import network_resource

FABRIC_ENV: Final[dict[str, dict[str, str]]] = {
    "none": {},
    # NCCL's verbs transport (the IB plugin) over the RDMA device the device plugin mounted.
    "infiniband": {"NCCL_IB_DISABLE": "0"},
    # RoCE uses the same verbs transport; NCCL selects the RoCE v2 GID itself (NCCL >= 2.21).
    "roce": {"NCCL_IB_DISABLE": "0"},
    # libfabric's EFA provider through the aws-ofi-nccl plugin, with GPUDirect RDMA (p4d, p5)
    # and fork safety for pinned memory (data-loader workers fork).
    "efa": {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "RDMAV_FORK_SAFE": "1"},
}


def devices(spec: MegatronJobSpec) -> dict[str, str]:
    """The fabric's device-plugin resource and count, for both requests and limits."""
    name = network_resource(spec)
    return {name: str(spec.resources.network.devices)} if name else {}


def env(spec: MegatronJobSpec) -> dict[str, str]:
    """The fabric's env, minus what spec.env sets itself."""
    own = {e.name for e in spec.env}
    return {k: v for k, v in FABRIC_ENV[spec.resources.network.fabric].items() if k not in own}


def needs_ipc_lock(spec: MegatronJobSpec) -> bool:
    """RDMA pins (locks) memory for the NIC: every fabric but plain sockets needs IPC_LOCK."""
    return spec.resources.network.fabric != "none"
