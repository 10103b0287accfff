"""Rendered pods → local processes (pure): the same command and env contract, on loopback.

As torchx's local scheduler runs the same AppDef it would submit, `mjob run --local` runs the
objects the operator would create: each Pod becomes one process group running the pod's container
command with the pod's env. Only what cannot exist locally is swapped: MASTER_ADDR becomes
loopback, the checkpoint volume a directory, the mounted ConfigMap a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_contract.env import (
    CONFIG,
    COORDINATOR_KEY_FILE,
    COORDINATOR_PORT,
    MASTER_ADDR,
    MASTER_PORT,
    MEMORY_CHECKPOINT_DIR,
    MSC_CONFIG,
    OMP_NUM_THREADS,
    PROGRESS_FILE,
    PROGRESS_LEASE,
    REPORT_FILE,
    SCRATCH,
    STATUS_FILE,
    WORLD_SIZE,
)
from megatron_contract.paths import (
    CHECKPOINT_MOUNT,
    CONFIG_KEY,
    CONTAINER_NAME,
    DATA_MOUNT,
    INIT_MOUNT,
    LAUNCHER_ZIPAPP,
)
from megatron_operator.api import FieldError, MegatronJobSpec
from megatron_operator.core.names import ANNOTATION_RESTART_STRATEGY, LABEL_SPARE


@dataclass(frozen=True)
class LocalPod:
    name: str
    node_rank: int
    argv: list[str]
    env: dict[str, str]
    strategy: str | None = None  # the pod's restart-strategy annotation
    spare: int | None = None  # a spare pod's number (resources.spareNodes)


@dataclass(frozen=True)
class Layout:
    """Where a local run keeps things, all under the workdir."""

    workdir: Path

    @property
    def config(self) -> Path:
        return self.workdir / "config.json"

    @property
    def checkpoints(self) -> Path:
        return self.workdir / "checkpoints"

    @property
    def progress(self) -> Path:
        return self.workdir / "progress.jsonl"

    @property
    def status(self) -> Path:
        """The job's status, written after each reconcile: the coordinator's decisions."""
        return self.workdir / "status.json"

    @property
    def report(self) -> Path:
        """The launchers' report (the progress Lease's annotation in a cluster)."""
        return self.workdir / "launchers.json"

    @property
    def launcher(self) -> Path:
        """The launcher zipapp a trainer.command's pods run (built once per run)."""
        return self.workdir / "launcher.pyz"

    @property
    def coordinator_key(self) -> Path:
        """The run's coordinator key (a Secret in a cluster): only this user may read it, so no
        other process on the machine can join the run's coordinator on loopback."""
        return self.workdir / "coordinator.key"

    @property
    def scratch(self) -> Path:
        return self.workdir / "scratch"

    def memory(self, pod: str) -> Path:
        """The pod's memory volume (in-memory checkpoints): one directory a pod, removed with
        the pod, so a replaced pod starts with none, as in a cluster."""
        return self.workdir / "memory" / pod

    @property
    def summary(self) -> Path:
        return self.workdir / "summary.json"

    @property
    def loss_plot(self) -> Path:
        return self.workdir / "loss.png"

    def logs(self, attempt: int) -> Path:
        return self.workdir / "logs" / f"attempt-{attempt}"

    def mounts(self) -> dict[str, Path]:
        """The pod's volume mounts as workdir directories: the checkpoint volume, and the data
        and init claims, which a local run cannot mount (put the files there)."""
        return {
            CHECKPOINT_MOUNT: self.checkpoints,
            DATA_MOUNT: self.workdir / "data",
            INIT_MOUNT: self.workdir / "init",
        }

    def local_path(self, value: str) -> str:
        """`value` with a pod mount path at its start replaced by its local directory."""
        for mount, local in self.mounts().items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value


def local_config(objs: list[dict[str, Any]], layout: Layout) -> dict[str, Any]:
    """The ConfigMap's trainer config with the volume path mapped to the workdir. Progress is
    reported every step locally: the summary keeps one loss per iteration."""
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    config: dict[str, Any] = json.loads(cm["data"][CONFIG_KEY])
    config["checkpoint"]["dir"] = layout.local_path(config["checkpoint"]["dir"])
    if config.get("training"):  # a trainer.command job may have no training section
        config["training"]["logInterval"] = 1
    return config


# spec.env reaches the host's processes under `mjob run --local`: these names make a process
# load code from wherever they point (the dynamic linker, the interpreter, the shell, torch's
# compiled caches, NCCL's plugins). In a pod they only affect the job's own container; on a
# laptop or a login node they run the YAML author's code as the user who ran it.
HOST_CODE_PREFIXES = ("LD_", "DYLD_", "PYTHON", "GLIBC_", "TORCHINDUCTOR_", "TRITON_")
HOST_CODE_NAMES = frozenset(
    {
        "PATH",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "PS4",
        "IFS",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYOPT",
        "RUBYLIB",
        "NODE_OPTIONS",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "TORCH_EXTENSIONS_DIR",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "CUDA_INJECTION64_PATH",
    }
)


def _loads_code(name: str) -> bool:
    return name.upper() in HOST_CODE_NAMES or name.upper().startswith(HOST_CODE_PREFIXES)


def host_env_problems(spec: MegatronJobSpec) -> list[FieldError]:
    """The env entries that would load code on this host under `mjob run --local`: spec.env's,
    and the template's trainer container's (merged into the same environment)."""
    named = [(f"spec.env[{i}].name", e.name) for i, e in enumerate(spec.env)]
    pod = spec.template.spec if spec.template is not None else None
    for c, container in enumerate(pod.containers or [] if pod is not None else []):
        if container.name == CONTAINER_NAME:
            where = f"spec.template.spec.containers[{c}].env"
            named += [(f"{where}[{i}].name", e.name) for i, e in enumerate(container.env or [])]
    return [
        FieldError(
            path,
            f"{name} makes a local process load code from where it points, and `mjob run "
            "--local` runs on this machine: remove it, or pass --trust-env if you wrote this "
            "file yourself",
        )
        for path, name in named
        if _loads_code(name)
    ]


def _env_value(item: dict[str, Any], pod: dict[str, Any]) -> str | None:
    if "value" in item:
        return str(item["value"])
    field = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if field == "metadata.name":
        return str(pod["metadata"]["name"])
    if field == "metadata.namespace":
        return str(pod["metadata"]["namespace"])
    return None


def _spare(pod: dict[str, Any]) -> int | None:
    """A spare pod's number (resources.spareNodes), else None."""
    value = pod["metadata"]["labels"].get(LABEL_SPARE)
    return int(value) if value is not None else None


def rank_threads(cores: int, world_size: int) -> int:
    """This machine's cores shared between all of the job's ranks (spares run none). Without it
    each local pod's launcher gave its ranks all of the machine's cores (two pods on two cores
    ran four compute threads), and with two threads a rank's results differed in the last bit
    in 3 of 20 runs of the same job here (some steps matching a one-thread run's), so a resumed
    run was not always bit-identical to an uninterrupted one."""
    return max(1, cores // max(1, world_size))


def local_pods(
    objs: list[dict[str, Any]],
    layout: Layout,
    python: str,
    port: int,
    coordinator_port: int,
    cores: int,
) -> list[LocalPod]:
    out = []
    for pod in (o for o in objs if o["kind"] == "Pod"):
        container = pod["spec"]["containers"][0]
        env: dict[str, str] = {}
        for item in container.get("env", []):
            value = _env_value(item, pod)
            if value is not None:
                env[item["name"]] = layout.local_path(value)
        env.update(
            {
                MASTER_ADDR: "127.0.0.1",
                MASTER_PORT: str(port),
                COORDINATOR_PORT: str(coordinator_port),
                COORDINATOR_KEY_FILE: str(layout.coordinator_key),
                CONFIG: str(layout.config),
                PROGRESS_FILE: str(layout.progress),
                STATUS_FILE: str(layout.status),
                REPORT_FILE: str(layout.report),
                # A trainer.command's `python` is this environment's, as the launcher's is.
                "PATH": os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
            }
        )
        # No apiserver here: progress goes to the file, which the runner follows, and the
        # coordinator reads the runner's decisions from the status file.
        env.pop(PROGRESS_LEASE, None)
        # checkpoint.url: this machine's MSC_CONFIG (inherited) replaces the mounted Secret.
        env.pop(MSC_CONFIG, None)
        if SCRATCH in env:
            env[SCRATCH] = str(layout.scratch / pod["metadata"]["name"])
        if MEMORY_CHECKPOINT_DIR in env:
            env[MEMORY_CHECKPOINT_DIR] = str(layout.memory(pod["metadata"]["name"]))
        if OMP_NUM_THREADS not in env and OMP_NUM_THREADS not in os.environ:
            world = int(env[WORLD_SIZE]) if env.get(WORLD_SIZE, "").isdigit() else 1
            env[OMP_NUM_THREADS] = str(rank_threads(cores, world))
        argv = list(container["command"]) + list(container.get("args", []))
        if argv and argv[0] in ("python", "python3"):
            argv[0] = python  # the image's interpreter is this environment's
        if argv[1:2] == [LAUNCHER_ZIPAPP]:
            argv[1] = str(layout.launcher)  # the init container's copy: built by the runner
        out.append(
            LocalPod(
                name=pod["metadata"]["name"],
                node_rank=int(pod["metadata"]["labels"]["megatron.dev/node-rank"]),
                spare=_spare(pod),
                argv=argv,
                env=env,
                strategy=(pod["metadata"].get("annotations") or {}).get(
                    ANNOTATION_RESTART_STRATEGY
                ),
            )
        )
    return out
