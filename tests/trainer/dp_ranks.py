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


def broadcast(world: int, workdir: Path) -> dict[str, Any]:
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


def buckets(world: int, workdir: Path) -> dict[str, Any]:
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


def dcp(world: int, workdir: Path) -> dict[str, Any]:
    """An fsdp_dtensor checkpoint through the trainer's own functions (fsdp_checkpoint.py and
    the scan in checkpoint.py): DTensor shards as Megatron FSDP's state dicts hold them (the
    model's, and the optimizer's fsdp_dtensor state), Megatron-LM's other entries, our record."""
    import json
    from argparse import Namespace

    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    from megatron_trainer import checkpoint, fsdp_checkpoint

    rank = torch.distributed.get_rank()
    mesh = DeviceMesh("cpu", list(range(world)))

    def sharded(seed: int, rows: int = 6) -> DTensor:
        torch.manual_seed(seed)  # the same global tensor on every rank, each keeps its rows
        return distribute_tensor(torch.randn(rows, 4), mesh, [Shard(0)])

    def state(seed: int, iteration: int, loss: float) -> dict[str, Any]:
        return {
            "args": Namespace(ckpt_format="fsdp_dtensor", use_megatron_fsdp=True),
            "checkpoint_version": fsdp_checkpoint.CHECKPOINT_VERSION,
            "iteration": iteration,
            # 7 rows over 2 ranks: unevenly sharded, as Megatron FSDP's flat buffers make them.
            "model": {"decoder.layers.0.mlp.linear_fc2.weight": sharded(seed, rows=7)},
            "optimizer": {
                "state": {"decoder.layers.0.mlp.linear_fc2.weight": {
                    "exp_avg": sharded(seed + 1, rows=7), "step": torch.tensor(float(iteration))
                }},
                "param_groups": [{"lr": 1e-3, "params": ["decoder.layers.0.mlp.linear_fc2.weight"]}],
            },
            "opt_param_scheduler": {"num_steps": 8 * iteration, "max_lr": 1e-3},
            "rng_state": {"(0, 0)": [{"torch_rng_state": torch.get_rng_state()}]},
            fsdp_checkpoint.TRAINER_KEY: json.dumps({"iteration": iteration, "loss": loss}),
        }  # fmt: skip

    root = workdir / "ckpt"
    saved = {}
    for iteration, loss in [(2, 6.5), (4, float("nan"))]:
        path = checkpoint.iteration_path(root, iteration)
        if rank == 0:
            Path(path).mkdir(parents=True)
        torch.distributed.barrier()
        saved[iteration] = state(iteration, iteration, loss)
        fsdp_checkpoint.save(fsdp_checkpoint.preprocess(saved[iteration], None, False, None), path)
    torch.distributed.barrier()

    out: dict[str, Any] = {}
    path = checkpoint.iteration_path(root, 4)
    out["files"] = sorted(p.name for p in Path(path).iterdir())
    out["format"] = checkpoint.format_of(path)
    out["complete"] = checkpoint.scan(root).complete
    common = checkpoint.load_common(path)
    out["common"] = {
        "iteration": common["iteration"],
        "trainer": common["trainer"]["iteration"],
        "args": vars(common["args"]),
    }
    out["losses"] = {i: checkpoint.read_loss(checkpoint.iteration_path(root, i)) for i in (2, 4)}

    # Load iteration 4 into fresh shards (zeros), as a resume does.
    target = state(100, 0, 0.0)
    for shard in (
        target["model"],
        target["optimizer"]["state"]["decoder.layers.0.mlp.linear_fc2.weight"],
    ):
        for value in shard.values():
            if isinstance(value, DTensor):
                value.to_local().zero_()
    loaded = fsdp_checkpoint.preprocess(target, None, False, None)
    fsdp_checkpoint.load(loaded, path)
    key = "decoder.layers.0.mlp.linear_fc2.weight"
    out["model_equal"] = torch.equal(
        target["model"][key].to_local(), saved[4]["model"][key].to_local()
    )
    out["exp_avg_equal"] = torch.equal(
        target["optimizer"]["state"][key]["exp_avg"].to_local(),
        saved[4]["optimizer"]["state"][key]["exp_avg"].to_local(),
    )
    out["loaded_scheduler"] = loaded["opt_param_scheduler"]
    out["loaded_iteration"] = loaded["iteration"]
    torch.distributed.barrier()

    # An interrupted save: a shard file cut short, then no .metadata at all.
    if rank == 0:
        from megatron_trainer.export import ExportError, checkpoint_path

        try:
            checkpoint_path(root, 2)
        except ExportError as err:
            out["export"] = str(err)
        shard_file = next(Path(path).glob("*.distcp"))
        shard_file.write_bytes(shard_file.read_bytes()[:-8])
        out["truncated"] = checkpoint.incomplete_reason(path)
        (Path(path) / ".metadata").unlink()
        out["no_metadata"] = checkpoint.incomplete_reason(path)
        out["after"] = checkpoint.scan(root).complete
    return out


CHECKS = {"broadcast": broadcast, "buckets": buckets, "dcp": dcp}


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
    results = {name: check(world, workdir) for name, check in CHECKS.items()}
    (workdir / f"rank{rank}.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
