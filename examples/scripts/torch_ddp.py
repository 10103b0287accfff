"""A plain torch.distributed training script, run by a MegatronJob's spec.trainer.command
(examples/byo-torch-ddp.yaml). Nothing here knows about the operator beyond its env contract
(docs/bring-your-own-code.md):

- RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which `init_process_group`'s env://
  reads, set per rank by the launcher;
- the checkpoint directory and the attempt, passed as arguments through $(VAR) expansion;
- MEGATRON_PROGRESS_LOG, where rank 0 appends `ITERATION LOSS` lines: the job's progress;
- SIGTERM, which the launcher forwards on suspend or preemption: every rank agrees on the step,
  rank 0 saves, and the script exits 143 (the operator restarts it without counting).

It fits y = x·w with DistributedDataParallel and resumes from its newest checkpoint, so a
restarted gang continues where it stopped. `--fail-at-step S --fail-rank R` makes rank R exit 1
at step S on attempt 0 only: a demonstration of a gang restart.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
STOP = {"requested": False}


def on_sigterm(signum: int, frame: object) -> None:
    STOP["requested"] = True


def report(step: int, loss: float, checkpoint: int | None) -> None:
    """One progress line, appended to the file the launcher follows (when there is one)."""
    path = os.environ.get("MEGATRON_PROGRESS_LOG")
    if not path:
        return
    line = f"{step} {loss:.6f}" + (f" checkpoint={checkpoint}" if checkpoint else "")
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def save(path: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, path)  # a checkpoint is either whole or absent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--save-interval", type=int, default=10)
    p.add_argument("--attempt", type=int, default=0)
    p.add_argument("--fail-at-step", type=int)
    p.add_argument("--fail-rank", type=int, default=1)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// from the launcher's env
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    ranks = [None] * world
    dist.all_gather_object(ranks, (rank, local_rank, socket.gethostname()))
    if rank == 0:
        print(f"torch_ddp: world size {dist.get_world_size()}, ranks {ranks}", flush=True)
    assert dist.get_world_size() == world and sorted(r[0] for r in ranks) == list(range(world))

    torch.manual_seed(1234)
    model = torch.nn.Linear(FEATURES, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    path = os.path.join(args.checkpoint_dir, "torch_ddp.pt")
    start = 0
    if os.path.exists(path):
        state = torch.load(path, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        if rank == 0:
            print(f"torch_ddp: resumed from step {start} (attempt {args.attempt})", flush=True)
    ddp = DistributedDataParallel(model)
    truth = torch.arange(FEATURES, dtype=torch.float32, device=device) / FEATURES

    for step in range(start + 1, args.steps + 1):
        gen = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(32, FEATURES, generator=gen).to(device)
        loss = torch.nn.functional.mse_loss(ddp(x).squeeze(-1), x @ truth)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        stop = torch.tensor([1.0 if STOP["requested"] else 0.0], device=device)
        dist.all_reduce(stop)  # every rank stops at the same step
        saved = None
        if step % args.save_interval == 0 or step == args.steps or stop.item() > 0:
            if rank == 0:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                save(path, step, model, opt)
            dist.barrier()
            saved = step
        if rank == 0:
            report(step, mean.item() / world, saved)
        if stop.item() > 0:
            print(f"torch_ddp: SIGTERM: saved step {step}, exiting", flush=True)
            dist.destroy_process_group()
            return 143
        if args.fail_at_step == step and rank == args.fail_rank and args.attempt == 0:
            print(f"torch_ddp: rank {rank} fails at step {step} (attempt 0)", flush=True)
            sys.stdout.flush()
            os._exit(1)
    dist.destroy_process_group()
    if rank == 0:
        print(f"torch_ddp: done, {args.steps} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
