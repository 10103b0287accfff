"""One rank of the interchange tests: `python -m tests.trainer.hf_ranks STEPS.json`.

Started like a trainer pod's ranks (the contract env plus LOCAL_RANK; see `run_ranks`), it builds
the real trainer (`loop.Trainer`: process groups, model, optimizer, checkpointer) from the config
in MEGATRON_CONFIG and runs the steps in STEPS.json against it, in order:

    {"op": "import_hf", "dir": D}              hf.load_hf_into_model, then reload the optimizer
                                               (with "reads_out": R, each rank records to
                                               R/rank<N>.json what it read)
    {"op": "load_megatron", "path": P}         init_weights.load_megatron_weights (weights)
    {"op": "load_full", "path": P, "error_out": F}  load: full, then continue from its position;
                                               a ConfigError's message goes to F
    {"op": "train_step", "out": F}             one training step; rank 0 writes the loss to F
    {"op": "logits", "out": F}                 forward of `sample_tokens`; one rank writes F
    {"op": "save", "iteration": N}             Checkpointer.save, blocking

Top-level imports are light: the tests import `sample_tokens` and `run_ranks` from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from megatron_contract.ports import free_port

from .trainer_configs import write_config
from .trainer_runs import pod_env

REPO = Path(__file__).resolve().parents[2]
MICROBATCHES = 2  # sequences in the logits batch, one per micro-batch (the interleaved
# schedule needs a multiple of the pipeline size)


def sample_tokens(vocab: int, seq: int) -> torch.Tensor:
    """The fixed token batch [MICROBATCHES, seq] both sides compute logits of."""
    generator = torch.Generator().manual_seed(20261123)
    return torch.randint(0, vocab, (MICROBATCHES, seq), generator=generator)


def hf_logits(model_dir: Path, seq: int) -> torch.Tensor:
    """Hugging Face's own logits (transformers' LlamaForCausalLM, fp32) of `sample_tokens`."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(model_dir).float().eval()
    with torch.no_grad():
        return model(sample_tokens(model.config.vocab_size, seq)).logits


def read_safetensors(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory, by name."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def run_ranks(
    cfg: dict[str, Any], steps: list[dict[str, Any]], workdir: Path, timeout: float = 240.0
) -> str:
    """Run this module on every rank of `cfg`'s layout; returns their output, asserting success."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = write_config(cfg, workdir / "config.json")
    steps_path = workdir / "steps.json"
    steps_path.write_text(json.dumps(steps))
    world = cfg["resources"]["procsPerNode"]
    port = free_port()
    procs, logs = [], []
    started = time.monotonic()
    for rank in range(world):
        env = pod_env(cfg, config_path, port)
        env.update(LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        log_path = workdir / f"rank{rank}.log"
        with log_path.open("w") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tests.trainer.hf_ranks", str(steps_path)],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # a timeout kills the rank with its helpers
                )
            )  # fmt: skip
        logs.append(log_path)
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started))))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            codes.append(proc.wait())
    for proc in procs:  # helpers a rank left in its group (one that crashed before its atexit)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    output = "".join(f"--- {p.name}\n{p.read_text()}" for p in logs)
    assert codes == [0] * world, f"exit codes {codes}\n{output[-6000:]}"
    return output


# ---------------------------------------------------------------------------------------------
# Inside a rank


def _logits(trainer: Any, out: str) -> None:
    from megatron.core import parallel_state

    cfg = trainer.cfg
    tokens = sample_tokens(cfg.model.vocab_size, cfg.model.seq_length)
    positions = torch.arange(cfg.model.seq_length).unsqueeze(0)

    def collect(output: torch.Tensor, non_loss_data: bool = False) -> torch.Tensor:
        return output.detach().clone()

    def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
        batch = next(data)
        return model(batch, positions, None), partial(collect)

    for chunk in trainer.model:
        chunk.eval()
    iterators = [iter(tokens.split(1)) for _ in trainer.model]
    with torch.no_grad():
        outputs = trainer.forward_backward(
            forward_step_func=forward_step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=trainer.model,
            num_microbatches=MICROBATCHES,
            seq_length=cfg.model.seq_length,
            micro_batch_size=1,
            forward_only=True,
            collect_non_loss_data=True,
        )
    if not parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        return
    # Each TP rank holds a vocabulary slice. Megatron's own gather (runtime_gather_output) calls
    # torch.cuda, so gather here over the TP group.
    local = torch.cat(outputs)
    pieces = [
        torch.empty_like(local)
        for _ in range(parallel_state.get_tensor_model_parallel_world_size())
    ]
    torch.distributed.all_gather(
        pieces, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group()
    )
    if parallel_state.get_tensor_model_parallel_rank() == 0:
        torch.save(torch.cat(pieces, dim=-1)[..., : cfg.model.vocab_size], out)


def _record_reads() -> list[tuple[str, int]]:
    """From now on, record every tensor piece hf.py reads: (name, elements)."""
    from megatron_trainer.hf import SafetensorsDir

    reads: list[tuple[str, int]] = []
    original = SafetensorsDir.read

    def read(self: Any, name: str, *args: Any, **kwargs: Any) -> torch.Tensor:
        tensor = original(self, name, *args, **kwargs)
        reads.append((name, tensor.numel()))
        return tensor

    SafetensorsDir.read = read  # type: ignore[method-assign]
    return reads


def _run(steps: list[dict[str, Any]]) -> int:
    from megatron_contract.config import load_config
    from megatron_contract.env import runtime_env
    from megatron_trainer.imports import import_megatron_core

    import_megatron_core()
    from megatron.core import parallel_state

    from megatron_contract.errors import ConfigError
    from megatron_trainer import optim_compat
    from megatron_trainer.data import MicroBatches, build_dataset
    from megatron_trainer.hf import load_hf_into_model
    from megatron_trainer.init_weights import load_megatron_weights
    from megatron_trainer.loop import Trainer
    from megatron_trainer.signals import StopFlag

    env = runtime_env(os.environ)
    cfg = load_config(env.config_path)
    trainer = Trainer(cfg, env, int(os.environ["LOCAL_RANK"]), StopFlag())
    for step in steps:
        op = step["op"]
        if op == "import_hf":
            reads = _record_reads()
            load_hf_into_model(trainer.model, step["dir"], cfg.model)
            if "reads_out" in step:
                out = Path(step["reads_out"]) / f"rank{trainer.rank}.json"
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(reads))
            trainer.optimizer.reload_model_params()
        elif op == "load_megatron":
            load_megatron_weights(trainer.model, step["path"], step.get("load", "weights"))
            trainer.optimizer.reload_model_params()
        elif op == "load_full":
            # What the trainer does with `checkpoint.init.megatron.load: full`: optimizer and
            # scheduler too, then continue from the source's iteration and data position.
            try:
                point = load_megatron_weights(
                    trainer.model, step["path"], "full",
                    optimizer=trainer.optimizer, scheduler=trainer.scheduler,
                )  # fmt: skip
            except ConfigError as err:
                if "error_out" not in step:
                    raise
                Path(step["error_out"]).write_text(str(err))
                continue
            assert point.iteration is not None and point.consumed_samples is not None
            trainer.iteration, trainer.consumed_samples = point.iteration, point.consumed_samples
            trainer.data = MicroBatches(
                build_dataset(cfg, cfg.training.train_iters * cfg.training.global_batch_size),
                cfg, point.consumed_samples, parallel_state.get_data_parallel_rank(),
                trainer.platform.device,
            )  # fmt: skip
        elif op == "train_step":
            loss = trainer.train_step().loss
            if trainer.rank == 0:
                Path(step["out"]).write_text(json.dumps(loss))
        elif op == "logits":
            _logits(trainer, step["out"])
        elif op == "save":
            # Before any step torch's Adam has no state to save; Megatron's dummy step creates
            # it. During warm-up the LR is 0, so that step leaves the weights as they are.
            optim_compat.prepare_for_load(trainer.optimizer)
            trainer.checkpointer.save(
                step["iteration"], 0, trainer.model, trainer.optimizer, trainer.scheduler,
                blocking=True,
            )  # fmt: skip
        else:
            raise ValueError(f"unknown op {op!r}")
    return trainer._finish(0)


if __name__ == "__main__":
    from megatron_trainer.worker import _exit

    # As a rank does: atexit handlers first. Among them multiprocessing's, which stops the
    # spawn-context Manager process Megatron-Core's checkpoint writer starts on the first save;
    # a bare os._exit left one orphaned Manager per rank and run.
    _exit(_run(json.loads(Path(sys.argv[1]).read_text())))
