"""Run `python -m megatron_trainer` as a pod would: a subprocess with the contract env."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from configs import write_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    returncode: int
    output: str
    progress: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

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
    )
    return env


def run_trainer(
    cfg: dict[str, Any],
    workdir: Path,
    *,
    extra_env: dict[str, str] | None = None,
    timeout: float = 300.0,
    name: str = "run",
) -> Run:
    """Run every pod of the job (nodes × procsPerNode ranks) and wait for all of them."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(cfg, workdir / f"{name}-config.json")
    progress_file = workdir / f"{name}-progress.jsonl"
    progress_file.unlink(missing_ok=True)
    port = free_port()
    started = time.monotonic()
    pods = []
    for node in range(cfg["resources"]["nodes"]):
        env = pod_env(cfg, config_path, port, node)
        if node == 0:
            env["MEGATRON_PROGRESS_FILE"] = str(progress_file)
        env.update(extra_env or {})
        log = open(workdir / f"{name}-node{node}.log", "w")  # noqa: SIM115
        pods.append(
            (
                subprocess.Popen(
                    [sys.executable, "-m", "megatron_trainer"],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    codes = []
    for proc, log in pods:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started))))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            codes.append(-9)
        log.close()
    output = "".join((workdir / f"{name}-node{n}.log").read_text() for n in range(len(pods)))
    progress = []
    if progress_file.exists():
        progress = [json.loads(line) for line in progress_file.read_text().splitlines() if line]
    code = next((c for c in codes if c != 0), 0)
    return Run(code, output, progress, time.monotonic() - started)
