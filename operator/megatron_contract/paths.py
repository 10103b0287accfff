"""Where things are, in a trainer pod and on the checkpoint volume (docs/contract.md)."""

from __future__ import annotations

import re
from typing import Final

CONFIG_MOUNT: Final = "/etc/megatron"  # the ConfigMap's mount in the trainer container
CONFIG_KEY: Final = "config.json"  # the resolved trainer config's key in that ConfigMap
DEFAULT_CONFIG_PATH: Final = f"{CONFIG_MOUNT}/{CONFIG_KEY}"
CHECKPOINT_MOUNT: Final = "/mnt/checkpoints"  # the checkpoint volume's mount
SHM_MOUNT: Final = "/dev/shm"  # the memory-backed shared memory NCCL and data loaders use
DATA_MOUNT: Final = "/mnt/data"  # spec.data.volume's mount (read-only unless the spec says not)
INIT_MOUNT: Final = "/mnt/init"  # spec.checkpoint.init.volume's mount (always read-only)
# The pod's memory volume (an emptyDir with medium Memory) of the in-memory checkpoints.
MEMORY_MOUNT: Final = "/mnt/memory-checkpoints"
# The pod's parts the operator names: the trainer container, and the volumes behind the mounts
# above. A job's spec.template may not redefine them (api/template.py).
CONTAINER_NAME: Final = "trainer"
VOLUME_CONFIG: Final = "config"
VOLUME_CHECKPOINTS: Final = "checkpoints"
VOLUME_SHM: Final = "dshm"
VOLUME_DATA: Final = "megatron-data"
VOLUME_INIT: Final = "megatron-init"
VOLUME_MEMORY: Final = "megatron-memory"  # at MEMORY_MOUNT
VOLUME_MSC_CONFIG: Final = "megatron-msc-config"  # checkpoint.msc.configSecret, at MSC_CONFIG_MOUNT
VOLUME_SCRATCH: Final = "megatron-scratch"  # the emptyDir at SCRATCH_MOUNT (with checkpoint.url)
# A trainer.command's pods run the launcher from the operator's image, not from the job's: an init
# container of that image copies the launcher zipapp (megatron_operator/zipapp.py) into this
# emptyDir, and the trainer container runs it with the image's own python3.
VOLUME_LAUNCHER: Final = "megatron-launcher"
INIT_CONTAINER_LAUNCHER: Final = "megatron-launcher"
LAUNCHER_MOUNT: Final = "/opt/megatron-launcher"
LAUNCHER_ZIPAPP: Final = f"{LAUNCHER_MOUNT}/launcher.pyz"
# Where the operator image keeps its built copy (Dockerfile.operator, `mjob launcher build`).
LAUNCHER_IN_OPERATOR_IMAGE: Final = "/opt/megatron-operator/launcher.pyz"
MSC_CONFIG_MOUNT: Final = "/etc/megatron-msc"  # checkpoint.msc.configSecret's mount (read-only)
SCRATCH_MOUNT: Final = "/var/tmp/megatron"  # an emptyDir for files bound for object storage
# The job's coordinator key (a Secret the operator creates), read by the launchers only: the
# launchers and their coordinator prove to each other that they belong to the job.
VOLUME_COORDINATOR: Final = "megatron-coordinator"
COORDINATOR_KEY_MOUNT: Final = "/var/run/megatron-coordinator"
COORDINATOR_KEY: Final = "key"  # the Secret's key, and the file's name in the mount
COORDINATOR_KEY_PATH: Final = f"{COORDINATOR_KEY_MOUNT}/{COORDINATOR_KEY}"
PROFILES_DIR: Final = "profiles"  # <checkpoint dir>/profiles/<restart attempt>/<one file a rank>
# Where the trainer writes why it stopped; the kubelet copies it into the container's
# terminated state (message), which the operator puts in status.lastFailure. Kubernetes' default
# terminationMessagePath; pods also set FallbackToLogsOnError for crashes that write nothing.
TERMINATION_LOG: Final = "/dev/termination-log"
TERMINATION_MESSAGE_MAX: Final = 1024  # characters kept; the kubelet's own limit is 4096 bytes

# The Megatron-LM checkpoint layout, so Megatron-LM's own tools read our checkpoints:
#   <dir>/latest_checkpointed_iteration.txt   (written only once a save is complete)
#   <dir>/iter_0000100/...
TRACKER_FILE: Final = "latest_checkpointed_iteration.txt"
ITER_DIR_RE: Final = re.compile(r"^iter_([0-9]{7})$")
# The format of an iteration directory (Megatron-LM's --ckpt-format). torch_dist: Megatron-Core's
# dist_checkpointing (metadata.json, common.pt, and torch DCP's files); checkpoint.shardingType
# chooses its optimizer layout. fsdp_dtensor: plain torch DCP of DTensors (.metadata and
# *.distcp only), the one format Megatron FSDP saves (Megatron-LM's arguments.py asserts it).
TORCH_DIST: Final = "torch_dist"
FSDP_DTENSOR: Final = "fsdp_dtensor"
DCP_METADATA: Final = ".metadata"  # torch DCP's index of a checkpoint, written last


def checkpoint_format(fsdp: bool) -> str:
    """The format a layout saves and loads: fsdp_dtensor with Megatron FSDP, else torch_dist."""
    return FSDP_DTENSOR if fsdp else TORCH_DIST


# Rank 0's progress report (docs/contract.md §4): the JSON record is kept in this annotation of
# the job's progress Lease (env PROGRESS_LEASE), whose spec.renewTime is the heartbeat.
PROGRESS_ANNOTATION: Final = "megatron.dev/progress"
PROGRESS_MIN_INTERVAL_SECONDS: Final = 10
# The operator ignores a longer record: the contract's record is about 200 characters, and the
# trainer's pod is not trusted to keep it small.
PROGRESS_RECORD_MAX: Final = 4096


def iter_dir_name(iteration: int) -> str:
    """`iter_0000100` for iteration 100."""
    return f"iter_{iteration:07d}"


def checkpoint_dir(sub_path: str) -> str:
    """The checkpoint directory in the pod: `<mount>/<checkpoint.path or the job name>`."""
    return f"{CHECKPOINT_MOUNT}/{sub_path}"
