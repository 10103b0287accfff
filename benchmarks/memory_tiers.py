#!/usr/bin/env python3
"""The in-memory checkpoint tiers on the CPU tiny model: what a snapshot costs, how fast a restart
restores from memory, and how much memory the tiers hold.

    python benchmarks/memory_tiers.py            # gpt-tiny, 2 pods × 1 rank (DP2) on CPU
    python benchmarks/memory_tiers.py --gpu      # a 1.36B GPT on one GPU (the stall per snapshot)

Runs of the real trainer (`python -m megatron_trainer`, one process a pod, as a pod runs it),
each pod with its own memory directory on tmpfs (as the pods' memory volume) and one of the
machine's cores for its threads (OMP_NUM_THREADS, as the launcher sets it for a pod's share):
1. train with a snapshot every step (each rank's state into its pod's memory, a copy into the
   other pod's): the median step, the median snapshot stall (the trainer's own measure, in the
   same run: the state dict and its copy into the rank's host buffer, and any wait for the
   previous write), the write beside the next step (and the writer thread's CPU time), the
   bytes a rank snapshots per step, and the bytes the tiers hold, against the operator's
   estimate (core/tiers.py); then the same job without the tiers: the wall time per step and
   the pods' CPU time against it (what the write costs where training uses every core);
2. an in-place restart: the same memory directories, no durable checkpoint newer: restores
   from every pod's own memory (the Memory tier); the restore time is the trainer's own
   `clock.load` (finding the snapshot, loading and applying it);
3. a replaced pod: pod 1's memory directory is deleted first, so its rank's state comes from
   the copy in pod 0's (the Peer tier).
Goals: snapshot stall <= 3 % of the step, restore <= 1 s (tiny model). On a shared machine the
step time and the stall are measured in the same run, so load inflates both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer"))
sys.path.insert(0, str(ROOT / "operator"))

from megatron_contract.ports import free_port  # noqa: E402 - after the path tweak

SNAPSHOT_LINE = re.compile(
    r"snapshots: (\d+) written, median ([\d.]+)s each, (\d+) bytes of this rank's state, "
    r"(\d+) bytes in this rank's memory directory, median ([\d.]+)s each to write beside the next "
    r"step \(([\d.]+)s of CPU\)"
)


def config(
    workdir: Path, iters: int, gpu: bool, durable: Path, memory: bool = True
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.trainer.trainer_configs import tiny_config

    cfg = tiny_config(durable, dp=1 if gpu else 2, nodes=1 if gpu else 2, save_interval=10_000)
    cfg["training"]["trainIters"] = iters
    cfg["job"]["uid"] = "memory-tiers-benchmark"
    if memory:
        cfg["checkpoint"]["memory"] = {"dir": str(workdir / "unused"), "interval": 1,
                                       "replica": True}  # fmt: skip
    if gpu:
        from benchmarks.trainer_throughput import model_1p3b

        cfg["model"] = model_1p3b()
        cfg["resources"]["accelerator"] = "nvidia.com/gpu"
        cfg["training"].update(precision="bf16", globalBatchSize=8, microBatchSize=1,
                               numMicrobatches=8)  # fmt: skip
    return cfg


def run(
    cfg: dict[str, Any], workdir: Path, name: str, memory: Path
) -> tuple[list[list[str]], float]:
    """Every pod of the job as one `python -m megatron_trainer`, its memory directory under
    `memory`: their output lines, and the CPU seconds of its pods, per pod."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(cfg))
    res = cfg["resources"]
    port = free_port()
    procs = []
    for node in range(res["nodes"]):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_")}
        env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NNODES=str(res["nodes"]),
            WORLD_SIZE=str(res["nodes"] * res["procsPerNode"]), NODE_RANK=str(node),
            NPROC_PER_NODE=str(res["procsPerNode"]), MEGATRON_CONFIG=str(path),
            MEGATRON_MEMORY_CHECKPOINT_DIR=str(memory / f"pod-{node}"),
            OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // res["nodes"])),
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(ROOT / "trainer"), str(ROOT / "operator"),
                              env.get("PYTHONPATH")])
            ),
        )  # fmt: skip
        log = (workdir / f"{name}-pod-{node}.log").open("w")
        procs.append((subprocess.Popen([sys.executable, "-m", "megatron_trainer"], env=env,
                                       stdout=log, stderr=subprocess.STDOUT), log))  # fmt: skip
    outputs = []
    for node, (proc, log) in enumerate(procs):
        code = proc.wait(timeout=1800)
        log.close()
        text = (workdir / f"{name}-pod-{node}.log").read_text()
        if code != 0:
            raise SystemExit(f"{name}: pod {node} exited with {code}:\n{text[-3000:]}")
        outputs.append(text.splitlines())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return outputs, cpu / res["nodes"]


def progress(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("MEGATRON_PROGRESS ")]


def per_step(records: list[dict[str, Any]]) -> float:
    """Wall seconds per step over these records (rank 0's own clock)."""
    first, last = records[0], records[-1]
    seconds = float(last["clock"]["now"]) - float(first["clock"]["now"])
    return seconds / (int(last["iteration"]) - int(first["iteration"]))


def estimate(cfg: dict[str, Any]) -> int | None:
    """The operator's estimate of the bytes a pod's memory volume holds (core/tiers.py)."""
    from megatron_operator.api import MegatronJobSpec
    from megatron_operator.core import tiers
    from megatron_operator.core.planner import plan

    t, res = cfg["training"], cfg["resources"]
    spec = MegatronJobSpec.model_validate(
        {
            "model": {"recipe": "gpt-tiny"},
            "parallelism": {"tensor": 1},
            "training": {"globalBatchSize": t["globalBatchSize"], "trainIters": t["trainIters"],
                         "microBatchSize": t["microBatchSize"], "precision": t["precision"]},
            "data": {"mock": True},
            "resources": {"nodes": res["nodes"], "procsPerNode": res["procsPerNode"],
                          "accelerator": res["accelerator"]},
            "checkpoint": {"volume": {"claimName": "x"}},
        }
    )  # fmt: skip
    p = plan(spec)
    assert p.training is not None
    return tiers.pod_bytes(spec, p.memory, p.degrees, p.training.precision)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps not measured")
    parser.add_argument("--gpu", action="store_true", help="a 1.36B GPT on one GPU")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("memory_tiers --gpu: no CUDA GPU is visible; nothing measured", file=sys.stderr)
            return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="memory-tiers-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    # The pods' memory directories on tmpfs, as their memory volume (emptyDir, medium Memory).
    shm = Path("/dev/shm")
    memory = Path(tempfile.mkdtemp(prefix="memory-tiers-", dir=shm if shm.is_dir() else workdir))

    train = config(workdir, args.iters, args.gpu, workdir / "durable-1")
    pods, cpu_train = run(train, workdir, "train", memory)
    records = [r for r in progress(pods[0]) if r["iteration"] > args.warmup]
    gbs, seq = train["training"]["globalBatchSize"], train["model"]["seqLength"]
    step = statistics.median(gbs * seq / r["tokensPerSecond"] for r in records)
    found = [m for m in map(SNAPSHOT_LINE.search, pods[0]) if m]
    if not found:
        raise SystemExit("the trainer logged no snapshot summary")
    count, stall, state_bytes, held, write, cpu = found[-1].groups()
    # The cost beside the stall: the writer thread shares the cores with training. The same
    # job without the tiers, its wall time per step against this one's.
    plain = config(workdir, args.iters, args.gpu, workdir / "durable-plain", memory=False)
    plain_pods, cpu_plain = run(plain, workdir, "plain", memory)
    wall, wall_plain = (
        per_step([r for r in progress(lines) if r["iteration"] > args.warmup])
        for lines in (pods[0], plain_pods[0])
    )
    cpu_step = (cpu_train - cpu_plain) / args.iters
    copies = 2 if train["checkpoint"]["memory"]["replica"] and not args.gpu else 1
    buffers = int(state_bytes) * copies * train["resources"]["procsPerNode"]
    pod_bytes = sum(p.stat().st_size for p in (memory / "pod-0").rglob("*.pt"))

    restores = {}
    cases = [("Memory", None)] + ([] if args.gpu else [("Peer", "pod-1")])
    for tier, lose in cases:
        if lose is not None and (memory / lose).exists():
            shutil.rmtree(memory / lose)
        again = config(workdir, args.iters + 2, args.gpu, workdir / f"durable-{tier}")
        first = progress(run(again, workdir, f"restore-{tier}", memory)[0][0])[0]
        assert first["restored"]["tier"] == tier, first
        restores[tier] = (first["clock"]["load"], first["restored"]["step"])

    device = "GPU" if args.gpu else f"CPU ({os.cpu_count()} cores)"
    load = os.getloadavg()[0]
    overhead = float(stall) / step
    est = estimate(train) if not args.gpu else None
    print(
        f"\nmemory tiers, {'1.36B GPT bf16, 1 GPU' if args.gpu else 'gpt-tiny fp32, 2 pods x 1 rank'}"
        f"; {datetime.now(UTC):%Y-%m-%d}, {device}, load average {load:.1f}\n"
        f"step (median):              {step * 1000:.1f} ms\n"
        f"snapshot stall (median):    {float(stall) * 1000:.2f} ms = {overhead:.2%} of the step "
        f"({count} snapshots)\n"
        f"write (median):             {float(write) * 1000:.2f} ms beside the next step, of "
        f"which {float(cpu) * 1000:.2f} ms of CPU (the writer thread's)\n"
        f"wall time per step:         {wall * 1000:.1f} ms with the tiers, "
        f"{wall_plain * 1000:.1f} ms without ({wall / wall_plain - 1:+.1%})\n"
        f"CPU per pod and step:       {cpu_step * 1000:+.1f} ms with the tiers (the pods' CPU "
        "time, gloo's and the kernel's included, against the run without, per step)\n"
        f"bytes per step, per rank:   {int(state_bytes):,} (its state; the same again to its "
        "peer)\n"
        f"memory held, per pod:       {pod_bytes:,} bytes on the volume now ({int(held):,} in "
        f"rank 0's directory at its last snapshot), and {buffers:,} in the rank's buffers (its "
        f"staged copy and its peer's); estimate {est if est is None else f'{est:,}'} (at most: "
        "two steps on the volume while one is written, and one in the buffers)\n"
        f"restore, in place (Memory): {restores['Memory'][0]:.2f} s (step "
        f"{restores['Memory'][1]})"
        + (
            f"\nrestore, pod lost (Peer):   {restores['Peer'][0]:.2f} s (step "
            f"{restores['Peer'][1]})"
            if "Peer" in restores
            else ""
        )
    )
    shutil.rmtree(memory, ignore_errors=True)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
