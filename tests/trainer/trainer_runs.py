"""Run `python -m megatron_trainer` as pods do: one subprocess per pod, with the contract env."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_contract.ports import free_port

from .trainer_configs import write_config


@dataclass
class Run:
    returncode: int
    output: str
    progress: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    checkpoint_dir: Path | None = None

    def losses(self) -> dict[int, float]:
        """Loss per iteration; a later report of the same iteration (after a resume) wins."""
        return {r["iteration"]: r["loss"] for r in self.progress if r["loss"] is not None}


def pod_env(
    cfg: dict[str, Any], config_path: Path, port: int, node_rank: int = 0
) -> dict[str, str]:
    res = cfg["resources"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_", "OMP_"))}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(res["nodes"] * res["procsPerNode"]),
        NNODES=str(res["nodes"]),
        NODE_RANK=str(node_rank),
        NPROC_PER_NODE=str(res["procsPerNode"]),
        MEGATRON_CONFIG=str(config_path),
        MEGATRON_JOB_NAME=cfg["job"]["name"],
        MEGATRON_RESTART_ATTEMPT="0",
        # Every multi-rank test also reports which CPU patches were used (test_cpu_platform).
        MEGATRON_CPU_PATCH_REPORT=str(config_path.parent),
    )
    return env


@dataclass
class Pods:
    """The running pods of one job; `wait()` turns them into a Run."""

    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]
    progress_file: Path
    started: float
    checkpoint_dir: Path

    def progress(self) -> list[dict[str, Any]]:
        if not self.progress_file.exists():
            return []
        lines = self.progress_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def wait(self, timeout: float = 300.0) -> Run:
        codes = []
        for proc in self.procs:
            try:
                left = max(1.0, timeout - (time.monotonic() - self.started))
                codes.append(proc.wait(timeout=left))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                codes.append(-9)
        output = "".join(log.read_text() for log in self.logs)
        code = next((c for c in codes if c != 0), 0)
        seconds = time.monotonic() - self.started
        return Run(code, output, self.progress(), seconds, self.checkpoint_dir)


def start_trainer(
    cfg: dict[str, Any],
    workdir: Path,
    *,
    extra_env: dict[str, str] | None = None,
    name: str = "run",
) -> Pods:
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(cfg, workdir / f"{name}-config.json")
    progress_file = workdir / f"{name}-progress.jsonl"
    progress_file.unlink(missing_ok=True)
    port = free_port()
    procs, logs = [], []
    for node in range(cfg["resources"]["nodes"]):
        env = pod_env(cfg, config_path, port, node)
        if node == 0:
            env["MEGATRON_PROGRESS_FILE"] = str(progress_file)
        env.update(extra_env or {})
        log_path = workdir / f"{name}-node{node}.log"
        with log_path.open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "megatron_trainer"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        logs.append(log_path)
    return Pods(procs, logs, progress_file, time.monotonic(), Path(cfg["checkpoint"]["dir"]))


def run_trainer(
    cfg: dict[str, Any],
    workdir: Path,
    *,
    extra_env: dict[str, str] | None = None,
    timeout: float = 300.0,
    name: str = "run",
) -> Run:
    """Run every pod of the job (nodes x procsPerNode ranks) to completion."""
    return start_trainer(cfg, workdir, extra_env=extra_env, name=name).wait(timeout)


def processes_with_env(needle: str) -> list[int]:
    """PIDs whose environment mentions `needle` (to find leftovers of a run)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle.encode() in environ:
            found.append(int(entry))
    return found


def relative_difference(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(abs(a[k] - b[k]) / abs(b[k]) for k in a)
