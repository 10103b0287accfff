"""The trainer container's environment (docs/contract.md §1): the names, and the one parser."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from megatron_contract.cpus import cpu_limit, limited_cores
from megatron_contract.errors import ConfigError
from megatron_contract.ladder import DEFAULT_COORDINATOR_PORT, RECREATE, STRATEGIES
from megatron_contract.paths import DEFAULT_CONFIG_PATH

MASTER_ADDR: Final = "MASTER_ADDR"
MASTER_PORT: Final = "MASTER_PORT"
WORLD_SIZE: Final = "WORLD_SIZE"
NNODES: Final = "NNODES"
NODE_RANK: Final = "NODE_RANK"
NPROC_PER_NODE: Final = "NPROC_PER_NODE"
# Each rank's threads for its math (torch's intra-op pool, MKL): the launcher's default is the
# pod's cores (no more than its CPU limit) shared between its ranks; `mjob run --local` shares
# the machine's between all.
OMP_NUM_THREADS: Final = "OMP_NUM_THREADS"


def usable_cores() -> int:
    """The cores OMP_NUM_THREADS shares out: those this process may run on (its CPU affinity),
    no more than its container's CPU limit (cpus.py)."""
    affinity = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return limited_cores(affinity, cpu_limit())


CONFIG: Final = "MEGATRON_CONFIG"
JOB_NAME: Final = "MEGATRON_JOB_NAME"
RESTART_ATTEMPT: Final = "MEGATRON_RESTART_ATTEMPT"
# The job's progress Lease (coordination.k8s.io/v1) that rank 0 writes; unset outside a cluster.
PROGRESS_LEASE: Final = "MEGATRON_PROGRESS_LEASE"
PROGRESS_FILE: Final = "MEGATRON_PROGRESS_FILE"
# The parallel layout, for a command's arguments (`--tensor-model-parallel-size $(MEGATRON_TP)`).
TP: Final = "MEGATRON_TP"
PP: Final = "MEGATRON_PP"
VPP: Final = "MEGATRON_VPP"  # model chunks per pipeline rank; 1 when not interleaved
CP: Final = "MEGATRON_CP"
EP: Final = "MEGATRON_EP"
ETP: Final = "MEGATRON_ETP"
DP: Final = "MEGATRON_DP"
SEQUENCE_PARALLEL: Final = "MEGATRON_SEQUENCE_PARALLEL"  # "true" or "false"
CHECKPOINT_DIR: Final = "MEGATRON_CHECKPOINT_DIR"  # the job's directory on the checkpoint volume
DATA_DIR: Final = "MEGATRON_DATA_DIR"  # where spec.data.volume is mounted (only then)
INIT_DIR: Final = "MEGATRON_INIT_DIR"  # where spec.checkpoint.init.volume is mounted (only then)
# The pod's memory volume for in-memory checkpoints (megatron_contract/tiers.py; only with them):
# a trainer.command's `--non-persistent-local-ckpt-dir $(MEGATRON_MEMORY_CHECKPOINT_DIR)`.
MEMORY_CHECKPOINT_DIR: Final = "MEGATRON_MEMORY_CHECKPOINT_DIR"
# The restart ladder (docs/contract.md §5): InPlace makes the launcher keep its pod through a
# failed rank and wait for the operator's decision; Recreate (and unset) makes it exit with the
# failed rank's code, as a plain launcher does.
RESTART_STRATEGY: Final = "MEGATRON_RESTART_STRATEGY"
# The port of MASTER_ADDR where the coordinator (the launcher of node rank 0) listens.
COORDINATOR_PORT: Final = "MEGATRON_COORDINATOR_PORT"
# Locally (`mjob run --local`), where there is no apiserver: the job status the runner writes
# (the coordinator reads the decision there) and the file the coordinator writes its report to.
STATUS_FILE: Final = "MEGATRON_STATUS_FILE"
REPORT_FILE: Final = "MEGATRON_REPORT_FILE"
# The file holding the job's coordinator key (paths.COORDINATOR_KEY_PATH in a pod; a file of the
# run's own locally): without it the launchers run no coordinator (no in-place restarts).
COORDINATOR_KEY_FILE: Final = "MEGATRON_COORDINATOR_KEY_FILE"
# Spare nodes (spec.resources.spareNodes): how many the job keeps (on every pod), and on a spare
# pod its index (its NODE_RANK is then NNODES + the index, never a rank: an older launcher refuses
# it). A spare runs no rank until the coordinator gives it one.
SPARE_NODES: Final = "MEGATRON_SPARE_NODES"
SPARE_INDEX: Final = "MEGATRON_SPARE_INDEX"
# The coordinator's address when it moved off node rank 0's pod (set on pods created after the
# move); unset: MASTER_ADDR.
COORDINATOR_ADDR: Final = "MEGATRON_COORDINATOR_ADDR"
POD_NAME: Final = "POD_NAME"
POD_NAMESPACE: Final = "POD_NAMESPACE"
# The pod's own IP (the downward API): the coordinator listens there only, not on every
# interface (a secondary network's included).
POD_IP: Final = "POD_IP"
# Never set by the operator: `STEP[:RANK[:KILL|TERM|RAISE|STOP]][,…]` for chaos tests (spec.env
# may set it). RAISE makes the rank fail with an uncaught exception, as an OOM or NCCL error
# would; STOP stops it (SIGSTOP), so the gang hangs in its next collective. Attempt 0 only.
INJECT_FAILURE: Final = "MEGATRON_INJECT_FAILURE"
# Never set by the operator: "<iteration>" makes that iteration's loss NaN on every rank (tests).
INJECT_NAN_LOSS: Final = "MEGATRON_INJECT_NAN_LOSS"

# checkpoint.url: multi-storage-client's own variable, the path of its config file (profiles,
# credentials), which the pods mount from checkpoint.msc.configSecret.
MSC_CONFIG: Final = "MSC_CONFIG"
# A node-local directory for files on their way to object storage (TensorBoard, profiles).
SCRATCH: Final = "MEGATRON_SCRATCH"

# Set by the launcher for each rank it starts (torchrun's names), not by the operator.
RANK: Final = "RANK"
LOCAL_RANK: Final = "LOCAL_RANK"
LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
GROUP_RANK: Final = "GROUP_RANK"
LAUNCHER_PID: Final = "MEGATRON_LAUNCHER_PID"
# A file a trainer.command appends `ITERATION [LOSS]` lines to (docs/bring-your-own-code.md):
# the launcher on node 0 forwards them as progress, as the built-in trainer reports its own.
PROGRESS_LOG: Final = "MEGATRON_PROGRESS_LOG"

DEFAULT_MASTER_PORT: Final = 29500

# What the renderer sets: spec.env must not shadow these.
RESERVED: Final = frozenset(
    {
        MASTER_ADDR,
        MASTER_PORT,
        WORLD_SIZE,
        NNODES,
        NODE_RANK,
        NPROC_PER_NODE,
        CONFIG,
        JOB_NAME,
        RESTART_ATTEMPT,
        PROGRESS_LEASE,
        PROGRESS_FILE,
        RESTART_STRATEGY,
        COORDINATOR_PORT,
        STATUS_FILE,
        REPORT_FILE,
        COORDINATOR_KEY_FILE,
        SPARE_NODES,
        SPARE_INDEX,
        COORDINATOR_ADDR,
        POD_NAME,
        POD_NAMESPACE,
        POD_IP,
        SCRATCH,
        TP,
        PP,
        VPP,
        CP,
        EP,
        ETP,
        DP,
        SEQUENCE_PARALLEL,
        CHECKPOINT_DIR,
        DATA_DIR,
        INIT_DIR,
        MEMORY_CHECKPOINT_DIR,
    }
)
# What the launcher sets per rank: spec.env must not set these either (it would be overwritten).
PER_RANK: Final = frozenset(
    {RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, LAUNCHER_PID, PROGRESS_LOG}
)
# The env the operator and launcher own. spec.template's trainer env may not set these, nor any
# other MEGATRON_ name (spec.env may set the test knobs below).
OWNED: Final = RESERVED | PER_RANK
OWNED_PREFIX: Final = "MEGATRON_"


@dataclass(frozen=True)
class FailureInjection:
    """Kill one rank after it completes `step` (INJECT_FAILURE, for tests and demos)."""

    step: int
    rank: int
    signal: str  # "KILL", "TERM", "RAISE" or "STOP"


@dataclass(frozen=True)
class RuntimeEnv:
    master_addr: str
    master_port: int
    world_size: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    config_path: str
    job_name: str | None
    pod_name: str | None
    pod_namespace: str | None
    restart_attempt: int
    progress_file: str | None
    progress_lease: str | None
    inject_failures: tuple[FailureInjection, ...]
    restart_strategy: str = RECREATE
    coordinator_port: int = DEFAULT_COORDINATOR_PORT
    status_file: str | None = None
    report_file: str | None = None
    coordinator_key_file: str | None = None
    pod_ip: str | None = None
    spare_nodes: int = 0
    spare: int | None = None  # this pod is spare number `spare` (it holds no rank yet)
    coordinator_addr: str | None = None

    def global_rank(self, local_rank: int) -> int:
        """Ranks are contiguous per node, so TP groups (innermost) stay inside one pod."""
        return self.node_rank * self.nproc_per_node + local_rank


def runtime_env(environ: Mapping[str, str]) -> RuntimeEnv:
    """Parse the contract env. Raises ConfigError naming every missing or malformed variable."""
    problems: list[str] = []

    def integer(name: str, minimum: int, default: int | None = None) -> int | None:
        raw = environ.get(name)
        if raw is None or raw == "":
            if default is None:
                problems.append(f"{name}: required environment variable is not set")
            return default
        try:
            value = int(raw)
        except ValueError:
            problems.append(f"{name}: expected an integer, got {raw!r}")
            return None
        if value < minimum:
            problems.append(f"{name}: must be >= {minimum}, got {value}")
            return None
        return value

    master_addr = environ.get(MASTER_ADDR, "")
    if not master_addr:
        problems.append(f"{MASTER_ADDR}: required environment variable is not set")
    master_port = integer(MASTER_PORT, 1, default=DEFAULT_MASTER_PORT)
    if master_port is not None and master_port > 65535:
        problems.append(f"{MASTER_PORT}: must be a TCP port (1-65535), got {master_port}")
    world_size = integer(WORLD_SIZE, 1)
    nnodes = integer(NNODES, 1)
    node_rank = integer(NODE_RANK, 0)
    nproc = integer(NPROC_PER_NODE, 1)
    restart_attempt = integer(RESTART_ATTEMPT, 0, default=0)
    coordinator_port = integer(COORDINATOR_PORT, 1, default=DEFAULT_COORDINATOR_PORT)
    spare_nodes = integer(SPARE_NODES, 0, default=0)
    spare = integer(SPARE_INDEX, 0, default=-1) if environ.get(SPARE_INDEX) else None
    if coordinator_port is not None and coordinator_port > 65535:
        problems.append(f"{COORDINATOR_PORT}: must be a TCP port (1-65535), got {coordinator_port}")
    strategy = environ.get(RESTART_STRATEGY) or RECREATE
    if strategy not in STRATEGIES:
        problems.append(
            f"{RESTART_STRATEGY}: must be one of {', '.join(STRATEGIES)}, got {strategy!r}"
        )
    sizes = (world_size, nnodes, nproc)
    if None not in sizes and world_size != (nnodes or 0) * (nproc or 0):
        problems.append(
            f"{WORLD_SIZE} ({world_size}) must equal {NNODES} ({nnodes}) × "
            f"{NPROC_PER_NODE} ({nproc})"
        )
    if spare is not None and spare_nodes is not None and spare >= spare_nodes:
        problems.append(f"{SPARE_INDEX} ({spare}) must be < {SPARE_NODES} ({spare_nodes})")
    elif spare is not None and None not in (node_rank, nnodes) and node_rank != nnodes + spare:  # type: ignore[operator]
        problems.append(
            f"{NODE_RANK} ({node_rank}) of spare {spare} must be {NNODES} + {SPARE_INDEX} "
            f"({(nnodes or 0) + spare})"
        )
    elif spare is None and node_rank is not None and nnodes is not None and node_rank >= nnodes:
        problems.append(f"{NODE_RANK} ({node_rank}) must be < {NNODES} ({nnodes})")
    injections = parse_injections(environ.get(INJECT_FAILURE, ""), problems)
    if problems:
        raise ConfigError(problems)
    assert master_port is not None and world_size is not None and nnodes is not None
    assert node_rank is not None and nproc is not None and restart_attempt is not None
    assert coordinator_port is not None and spare_nodes is not None
    return RuntimeEnv(
        master_addr=master_addr,
        master_port=master_port,
        world_size=world_size,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        config_path=environ.get(CONFIG) or DEFAULT_CONFIG_PATH,
        job_name=environ.get(JOB_NAME) or None,
        pod_name=environ.get(POD_NAME) or None,
        pod_namespace=environ.get(POD_NAMESPACE) or None,
        restart_attempt=restart_attempt,
        progress_file=environ.get(PROGRESS_FILE) or None,
        progress_lease=environ.get(PROGRESS_LEASE) or None,
        inject_failures=injections,
        restart_strategy=strategy,
        coordinator_port=coordinator_port,
        status_file=environ.get(STATUS_FILE) or None,
        report_file=environ.get(REPORT_FILE) or None,
        coordinator_key_file=environ.get(COORDINATOR_KEY_FILE) or None,
        pod_ip=environ.get(POD_IP) or None,
        spare_nodes=spare_nodes,
        spare=spare,
        coordinator_addr=environ.get(COORDINATOR_ADDR) or None,
    )


def parse_injections(raw: str, problems: list[str]) -> tuple[FailureInjection, ...]:
    """`STEP[:RANK[:SIGNAL]]`, comma-separated; the same syntax as `mjob run --inject-failure`."""
    result = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        parts = item.split(":")
        try:
            step = int(parts[0])
            rank = int(parts[1]) if len(parts) > 1 and parts[1] else 0
        except ValueError:
            step = rank = -1
        signal = (parts[2] if len(parts) > 2 else "KILL").upper().removeprefix("SIG")
        if (
            len(parts) > 3
            or step < 1
            or rank < 0
            or signal not in ("KILL", "TERM", "RAISE", "STOP")
        ):
            problems.append(
                f"{INJECT_FAILURE}: {item!r} is not STEP[:RANK[:KILL|TERM|RAISE|STOP]] (step >= 1, "
                "rank >= 0)"
            )
            continue
        result.append(FailureInjection(step, rank, signal))
    return tuple(result)
