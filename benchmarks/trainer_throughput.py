#!/usr/bin/env python3
"""Trainer throughput on one GPU: a ~1.3B GPT (seq 4096, bf16) through `python -m megatron_trainer`.

Prints tokens/s, TFLOP/s per GPU and MFU (Megatron-LM's FLOPs formula), the torch_dist checkpoint
save throughput (GB/s, from the final synchronous save) and the training stall per async save.
Goals (issue 4): >= 45% MFU without Transformer Engine; <= 1 s stall per async save.

    python benchmarks/trainer_throughput.py            # on a machine with an H100/H200
    python benchmarks/trainer_throughput.py --smoke    # gpt-tiny on CPU: checks the script only

It runs the real trainer (launcher, rank, checkpoints) on mock data, exactly what a pod runs, and
reads its progress lines and logs. Without a GPU it says so and measures nothing (unless --smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "trainer"))

from megatron_contract.config import parse_config  # noqa: E402 - after the path tweak
from megatron_contract.ports import free_port  # noqa: E402
from megatron_trainer.flops import flops_per_step  # noqa: E402

PEAK_NOTE = "MFU against the dense bf16 peak (H100/H200 SXM 989, NVL 835, H100 PCIe 756 TFLOP/s)"


def model_1p3b() -> dict[str, Any]:
    """Llama-style 1.36B: 24 layers, hidden 2048, 16 heads, SwiGLU 5632, vocab 32000, seq 4096."""
    return {
        "recipe": None, "numLayers": 24, "hiddenSize": 2048, "ffnHiddenSize": 5632,
        "numAttentionHeads": 16, "numQueryGroups": 16, "kvChannels": 128,
        "vocabSize": 32000, "paddedVocabSize": 32000, "seqLength": 4096,
        "maxPositionEmbeddings": 4096, "normalization": "RMSNorm", "activation": "swiglu",
        "positionEmbedding": "rope", "ropeTheta": 10000.0, "untieEmbeddingsAndOutputWeights": True,
        "normEpsilon": 1e-5, "attentionDropout": 0.0, "hiddenDropout": 0.0, "addBiasLinear": False,
        "ropeScaling": None, "moe": None, "mla": None,
    }  # fmt: skip


def model_tiny() -> dict[str, Any]:
    model = model_1p3b()
    model.update(
        recipe="gpt-tiny", numLayers=4, hiddenSize=128, ffnHiddenSize=352, numAttentionHeads=4,
        numQueryGroups=2, kvChannels=32, vocabSize=1024, paddedVocabSize=1024, seqLength=128,
        maxPositionEmbeddings=128,
    )  # fmt: skip
    return model


def resolved_config(args: argparse.Namespace, ckpt: Path, smoke: bool) -> dict[str, Any]:
    gbs, mbs = (8, 2) if smoke else (args.global_batch_size, args.micro_batch_size)
    return {
        "apiVersion": "megatron.dev/v1alpha1",
        "kind": "TrainerConfig",
        "job": {"name": "throughput", "namespace": "bench", "uid": "bench"},
        "model": model_tiny() if smoke else model_1p3b(),
        "parallelism": {"tensor": 1, "pipeline": 1, "virtualPipeline": None, "context": 1,
                        "expert": 1, "expertTensor": 1, "data": 1, "expertData": 1,
                        "sequenceParallel": False, "fsdp": False},
        "training": {"globalBatchSize": gbs, "microBatchSize": mbs,
                     "numMicrobatches": gbs // mbs, "trainIters": args.iters, "lr": 3e-4,
                     "minLr": 3e-5, "warmupIters": 2, "lrDecayStyle": "cosine",
                     "weightDecay": 0.1, "clipGrad": 1.0, "adamBeta1": 0.9, "adamBeta2": 0.95,
                     "precision": "fp32" if smoke else "bf16", "seed": 1234,
                     "recompute": args.recompute, "logInterval": 1},
        "data": {"mock": True, "blend": None, "tokenizer": None, "split": "100,0,0",
                 "numWorkers": 2},
        "checkpoint": {"dir": str(ckpt), "saveInterval": args.save_interval, "async": True,
                       "keep": 2, "shardingType": "dp_reshardable", "load": False, "init": None,
                       "memory": None},
        "resources": {"accelerator": "none" if smoke else "nvidia.com/gpu", "nodes": 1,
                      "procsPerNode": 1},
        "progress": {"annotation": "megatron.dev/progress", "minIntervalSeconds": 10},
        "profiling": None,
        "trainer": None,
    }  # fmt: skip


def run_trainer(config_path: Path, log_path: Path) -> tuple[int, list[str]]:
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", NNODES="1",
        NODE_RANK="0", NPROC_PER_NODE="1", MEGATRON_CONFIG=str(config_path),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "trainer"), env.get("PYTHONPATH")])),
    )  # fmt: skip
    lines: list[str] = []
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_trainer"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            lines.append(line.rstrip("\n"))
            if line.startswith("MEGATRON_PROGRESS ") or "checkpoint" in line:
                print("  " + line.rstrip("\n")[-140:], flush=True)
        return proc.wait(), lines


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def summarize(
    lines: list[str], cfg: dict[str, Any], ckpt: Path, warmup: int, device: str
) -> dict[str, Any]:
    progress = [json.loads(x.split(" ", 1)[1]) for x in lines if x.startswith("MEGATRON_PROGRESS ")]
    save_interval = cfg["checkpoint"]["saveInterval"]
    steady = [
        r["tokensPerSecond"]
        for r in progress
        if r["iteration"] > warmup
        and r["iteration"] % save_interval != 1  # skip post-save steps
        and r["tokensPerSecond"] is not None
    ]
    if not steady:
        raise SystemExit("no steady-state iterations were reported; raise --iters")
    tokens_per_s = statistics.median(steady)
    model = parse_config(cfg).model
    gbs = cfg["training"]["globalBatchSize"]
    step_seconds = gbs * model.seq_length / tokens_per_s
    tflops = flops_per_step(model, gbs) / step_seconds / 1e12
    mfus = [r["mfu"] for r in progress if r["iteration"] > warmup and r["mfu"] is not None]
    stalls = [
        float(m) for x in lines for m in re.findall(r"async save started \(([\d.]+)s stall\)", x)
    ]
    sync = [
        (int(m.group(1)), float(m.group(2)))
        for x in lines
        if (m := re.search(r"checkpoint (\d+) saved in ([\d.]+)s", x))
    ]
    save_gbps = None
    if sync:
        iteration, seconds = sync[-1]
        size = directory_bytes(ckpt / f"iter_{iteration:07d}")
        save_gbps = size / seconds / 1e9
    return {
        "device": device,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "tokens_per_second": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": statistics.median(mfus) if mfus else None,
        "step_seconds": step_seconds,
        "async_save_stall_seconds": max(stalls) if stalls else None,
        "sync_save_gb_per_second": save_gbps,
        "steady_iterations": len(steady),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report(result: dict[str, Any], model: str) -> str:
    mfu = _fmt(result["mfu"], ".1%")
    save = _fmt(result["sync_save_gb_per_second"], ".2f")
    stall = _fmt(result["async_save_stall_seconds"], ".2f")
    return (
        f"\ndevice: {result['device']}   date: {result['date']}   model: {model}\n"
        f"tokens/s: {result['tokens_per_second']:.0f}   TFLOP/s per GPU: "
        f"{result['tflops_per_gpu']:.2f}   MFU: {mfu} ({PEAK_NOTE})\n"
        f"checkpoint save: {save} GB/s (final synchronous save)   "
        f"stall per async save: {stall} s\n\n"
        "| date | device | model | tokens/s | TFLOP/s/GPU | MFU | save GB/s | async stall s |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {result['date']} | {result['device']} | {model} | {result['tokens_per_second']:.0f} | "
        f"{result['tflops_per_gpu']:.2f} | {mfu} | {save} | {stall} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=40, help="training iterations (default 40)")
    parser.add_argument("--warmup", type=int, default=10, help="iterations not measured")
    parser.add_argument("--save-interval", type=int, default=15, help="async save every N")
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    parser.add_argument("--workdir", type=Path, help="keep checkpoints and logs here")
    parser.add_argument("--smoke", action="store_true", help="gpt-tiny on CPU: test the script")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    import torch

    if args.smoke:
        device = "CPU (smoke test of the script, not a benchmark)"
    elif not torch.cuda.is_available():
        print(
            "trainer_throughput: no CUDA GPU is visible, so nothing was measured. This benchmark "
            "needs one H100 or H200 (run it there; --smoke only checks the script on CPU).",
            file=sys.stderr,
        )
        return 0
    else:
        device = torch.cuda.get_device_name()
    if args.iters <= args.warmup + 2:
        parser.error("--iters must exceed --warmup by at least 3")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="trainer-throughput-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "checkpoints"
    shutil.rmtree(ckpt, ignore_errors=True)
    cfg = resolved_config(args, ckpt, args.smoke)
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(cfg, indent=2))
    print(f"trainer_throughput: {device}; logs in {workdir}", flush=True)
    started = time.monotonic()
    code, lines = run_trainer(config_path, workdir / "trainer.log")
    if code != 0:
        print(f"trainer exited with {code}; see {workdir / 'trainer.log'}", file=sys.stderr)
        return code
    result = summarize(lines, cfg, ckpt, args.warmup, device)
    result["wall_seconds"] = time.monotonic() - started
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(report(result, "gpt-tiny fp32 (CPU)" if args.smoke else "GPT 1.36B bf16 seq 4096"))
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
