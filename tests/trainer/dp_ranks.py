"""Data parallelism 2 on two gloo ranks, for what needs real collectives but no training run
(test_data_parallel_cpu.py).

`python tests/trainer/dp_ranks.py RANK WORLD PORT WORKDIR` runs every check below on one rank and
writes what it saw to WORKDIR/rank<RANK>.json. Megatron FSDP itself cannot be built on CPU
(tests/trainer/test_fsdp_config.py says why), so its checks hold the parameters as `MegatronFSDP`
holds them once it has wrapped a model: DTensor shards over the data-parallel ranks, and run the
trainer's own code and Megatron-Core's own functions on them.
"""

from __future__ import annotations

import json
import sys
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def broadcast(world: int) -> dict[str, Any]:
    """The start-up broadcast (loop.broadcast_fresh_weights) with FSDP and with DDP."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp import MegatronFSDP
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from megatron_trainer.loop import broadcast_fresh_weights

    rank = torch.distributed.get_rank()
    dp_group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    mesh = DeviceMesh("cpu", list(range(world)))
    out: dict[str, Any] = {}

    # An FSDP chunk as Megatron FSDP's adapter holds it: its broadcast_params is MegatronFSDP's.
    layer = torch.nn.Linear(4, 2 * world, bias=False)
    layer.weight = torch.nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
    fsdp = SimpleNamespace(
        module=layer, dist_index=SimpleNamespace(get_dp_group=lambda **_: dp_group)
    )
    fsdp.broadcast_params = partial(MegatronFSDP.broadcast_params, fsdp)
    try:  # what the loop did before it knew about FSDP: Megatron FSDP's own broadcast raises
        broadcast_fresh_weights([fsdp], loads_weights=False, fsdp=False)
        out["fsdp_broadcast_error"] = None
    except NotImplementedError as err:
        out["fsdp_broadcast_error"] = str(err)
    out["fsdp_broadcast"] = broadcast_fresh_weights([fsdp], loads_weights=False, fsdp=True)

    # A DDP chunk: replicated plain tensors, different on each rank before the broadcast.
    replica = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        replica.weight.fill_(float(rank + 1))
    ddp = SimpleNamespace(module=replica, dp_cp_group=dp_group, expt_dp_group=dp_group)
    ddp.broadcast_params = partial(DistributedDataParallel.broadcast_params, ddp)
    out["ddp_broadcast"] = broadcast_fresh_weights([ddp], loads_weights=False, fsdp=False)
    out["ddp_weight"] = float(replica.weight[0, 0])
    return out


def buckets(world: int) -> dict[str, Any]:
    """A recorded bucket size through the trainer's decision (decisions.ddp_buckets), Megatron-
    Core's DistributedDataParallelConfig and DDP's own rule, against passing it through as is."""
    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    from megatron_trainer.decisions import ddp_buckets, one_bucket_as_none

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)

    def build(overlap: bool, size: int | None) -> Any:
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])  # 16,640
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            use_distributed_optimizer=True,
            overlap_grad_reduce=overlap,
            bucket_size=size,
        )
        return DistributedDataParallel(config, ddp_config, module=layers)

    def seen(ddp: Any) -> dict[str, Any]:
        return {
            "buckets": sum(len(b.buckets) for b in ddp.buffers),
            "recorded": one_bucket_as_none(ddp.ddp_config.bucket_size),
        }

    out: dict[str, Any] = {}
    # (recorded in the checkpoint, whether this run overlaps: True on CUDA, False on CPU)
    for name, recorded, overlap in [("one-bucket-gpu", None, True), ("5000-cpu", 5000, False)]:
        out[name] = seen(build(*ddp_buckets(recorded, overlap)))
        out[f"{name}-as-is"] = seen(build(overlap, recorded))  # what the trainer did before
    out["5000-saved"] = seen(build(True, 5000))  # the run that saved 5000-parameter buckets

    # The reverse case turns overlap on, also on CPU: one step's gradient sync over gloo.
    ddp = build(*ddp_buckets(5000, False))
    ddp.zero_grad_buffer()
    rank = torch.distributed.get_rank()
    ddp(torch.full((2, 64), float(rank + 1))).sum().backward()
    ddp.finish_grad_sync()
    out["overlap-sync"] = float(ddp.buffers[0].grad_data.abs().sum())
    return out


CHECKS = {"broadcast": broadcast, "buckets": buckets}


def main() -> int:
    rank, world, port, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    warnings.simplefilter("ignore")
    import torch

    from megatron_trainer.platform import cpu

    cpu.install()
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    results = {name: check(world) for name, check in CHECKS.items()}
    (workdir / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
