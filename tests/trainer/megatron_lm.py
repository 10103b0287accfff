"""Megatron-LM's own code (core_v0.16.1) as the oracle for our checkpoints, on CPU.

Megatron-LM is no pip package: megatron-core's sdist and wheel carry only `megatron/core`, and no
package on PyPI ships `megatron/training` at core_v0.16.1. So the source comes from a checkout
named by MEGATRON_LM_SRC (its root, holding `megatron/training`); the tests skip without one.
Its `megatron/{training,legacy,post_training,rl}` are imported beside the installed
megatron-core 0.16.1 (the same code as the tag's `megatron/core`, which `source_problem` checks).

`python tests/trainer/megatron_lm.py ARGS...` is one Megatron-LM rank (RANK, WORLD_SIZE,
MASTER_ADDR/PORT in the environment), run by `run_megatron_lm`. It runs from its path, not as
`tests.trainer.megatron_lm`: a full Megatron-LM checkout has its own top-level `tests` package,
which, once its root is on `sys.path`, is the `tests` that the worker processes Megatron-Core's
checkpoint writer spawns would find (a regular package wins over our namespace package), and
they re-import the main module by name. By path, they re-run this file instead. It does what `pretrain_gpt.py`
does before training: `initialize_megatron` (its `parse_args` on ARGS, `validate_args`, the
process groups, the seeds), then `setup_model_and_optimizer` (its model provider and
`gpt_builder`, `get_model`, `get_megatron_optimizer`, `get_optimizer_param_scheduler`, and
`load_checkpoint` from `--load`). Then it saves through its own `save_checkpoint` to `--save`, and
writes what it loaded to `$MEGATRON_LM_REPORT/rank<R>.json`.

What is ours here is only what lets Megatron-LM run without a GPU, all in this process:
- our CPU platform's patches of megatron-core (megatron_trainer.platform.cpu.install), and the
  same CUDA-to-CPU stand-in for the Megatron-LM modules that call CUDA directly
  (`MEGATRON_LM_CUDA_MODULES`), which also answers `device_count()` with 1 so that
  `_initialize_distributed` builds the model-parallel groups it builds on a GPU;
- `torch.nn.Module.cuda` returns the module unchanged (get_model moves the model to the GPU);
- no `make` of the dataset helpers (the megatron-core wheel ships them compiled, without the
  Makefile `_compile_dependencies` runs), and no nvcc build of its legacy fused CUDA kernels
  (unused with --no-masked-softmax-fusion);
- `torch.no_grad()` around the load, as our trainer loads: in fp32 the distributed optimizer's
  main parameters are views of the model's, and copying into them is an autograd error;
- torch's Adam (there is no TE or Apex FusedAdam on CPU) gets the three corrections of our
  `optim_compat` around the load, as in our trainer: Megatron-Core's distributed optimizer is
  written for FusedAdam, and with torch's Adam its `state_dict()` fails before the first step
  (no per-parameter `step` yet) and its load resets the Adam step;
- a `six` module when none is installed (only its BERT tokenizer imports it, never called here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

SOURCE_ENV = "MEGATRON_LM_SRC"
REPORT_ENV = "MEGATRON_LM_REPORT"
TAG = "core_v0.16.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "trainer.md"

HOW_TO = (
    f"set {SOURCE_ENV} to a Megatron-LM {TAG} checkout (git clone --branch {TAG} --depth 1 "
    "https://github.com/NVIDIA/Megatron-LM) to run Megatron-LM's own loader on our checkpoints"
)

# Megatron-LM modules that call CUDA directly on the paths these tests run.
MEGATRON_LM_CUDA_MODULES = (
    "megatron.training.initialize",  # device_count/set_device, the MoE aux-loss scale tensor
    "megatron.training.training",  # get_model: torch.cuda.Stream around the DDP wrap
    "megatron.training.checkpointing",  # torch.cuda RNG and device='cuda' tensors
    "megatron.training.utils",
    "megatron.core.rerun_state_machine",
    "megatron.core.timers",  # Megatron-LM's timers synchronize the GPU around each phase
)


def source_problem() -> str | None:
    """Why the Megatron-LM source cannot be used (None when it can)."""
    raw = os.environ.get(SOURCE_ENV)
    if not raw:
        return f"{SOURCE_ENV} is not set: {HOW_TO}"
    root = Path(raw)
    if not (root / "megatron" / "training" / "checkpointing.py").is_file():
        return f"{SOURCE_ENV}={raw} holds no megatron/training/checkpointing.py: {HOW_TO}"
    info = root / "megatron" / "core" / "package_info.py"
    found = re.findall(r"^(MAJOR|MINOR|PATCH) = (\d+)", info.read_text(), re.M)
    version = ".".join(v for _, v in found)
    from megatron.core import package_info

    if version != package_info.__version__:
        return (
            f"{SOURCE_ENV}={raw} is Megatron-LM {version}, but megatron-core "
            f"{package_info.__version__} is installed: check out {TAG}"
        )
    return None


def documented_flags(section: str) -> list[str]:
    """The flags of the ```-block after the `<!-- megatron-lm: SECTION -->` marker in
    docs/trainer.md: the test runs exactly what the documentation tells users to pass."""
    text = DOC.read_text()
    match = re.search(rf"<!-- megatron-lm: {re.escape(section)} -->\s*```\w*\n(.*?)```", text, re.S)
    assert match, f"docs/trainer.md has no Megatron-LM flag block {section!r}"
    body = match.group(1).replace("\\\n", " ")
    return [word for line in body.splitlines() for word in line.split("#")[0].split()]


def checkout_view(source: Path, into: Path) -> Path:
    """`source` laid out as a full `git clone` of Megatron-LM is: the subset in
    `../shared/megatron-lm` leaves out Megatron-LM's tests, whose top-level `tests` package is
    what a full checkout adds to `sys.path`. A directory of links to `source`'s entries, plus an
    empty `tests` package where `source` has none."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in source.resolve().iterdir():
        (into / entry.name).symlink_to(entry)
    if not (source / "tests" / "__init__.py").exists():
        (into / "tests").mkdir()
        (into / "tests" / "__init__.py").write_text("")
    return into


def run_megatron_lm(
    flags: list[str],
    world: int,
    workdir: Path,
    name: str,
    source: Path | None = None,
    timeout: float = 600.0,
) -> tuple[int, str, list[dict[str, Any]]]:
    """Run `world` Megatron-LM ranks with `flags` and the source at `source` (default: the
    MEGATRON_LM_SRC); (exit code, output, per-rank reports)."""
    from megatron_contract.ports import free_port

    report = workdir / f"{name}-report"
    report.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_", "OMP_"))}
    env.update(
        {
            SOURCE_ENV: str(source or os.environ[SOURCE_ENV]),
            REPORT_ENV: str(report),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",  # validate_args wants it with TP > 1 (Hopper)
        }
    )
    logs, procs = [], []
    for rank in range(world):
        log = workdir / f"{name}-rank{rank}.log"
        logs.append(log)
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), *flags],
                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO_ROOT,
                    start_new_session=True,  # a timeout kills the rank with its helpers
                )
            )
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            codes.append(proc.wait())
    output = "".join(log.read_text() for log in logs)
    reports = [
        json.loads((report / f"rank{r}.json").read_text())
        for r in range(world)
        if (report / f"rank{r}.json").exists()
    ]
    return next((c for c in codes if c != 0), 0), output, reports


# -- one rank -------------------------------------------------------------------------------


def _install_cpu_shims() -> None:
    import importlib

    import torch

    from megatron_trainer.platform import cpu

    cpu.install()

    class CudaForMegatronLM(cpu._CudaOnCpu):
        def device_count(self) -> int:
            return 1  # one "device" per rank, as on a GPU node

        def set_device(self, device: Any) -> None:
            pass

        def is_available(self) -> bool:
            return False

        def get_device_properties(self, device: Any = None) -> Any:
            return types.SimpleNamespace(major=9, minor=0, name="CPU standing in for a Hopper GPU")

        def Stream(self, *args: Any, **kwargs: Any) -> Any:
            return _NoStream()

        def current_stream(self, *args: Any, **kwargs: Any) -> Any:
            return _NoStream()

        def stream(self, stream: Any) -> Any:
            import contextlib

            return contextlib.nullcontext()

    for name in MEGATRON_LM_CUDA_MODULES:
        module = importlib.import_module(name)
        stand_in = cpu._TorchOnCpu(name)
        stand_in.cuda = CudaForMegatronLM(name)
        module.torch = stand_in  # type: ignore[attr-defined]
    torch.nn.Module.cuda = lambda self, device=None: self  # type: ignore[method-assign,assignment]
    # The megatron-core wheel ships the compiled dataset helpers, but not the Makefile that
    # _compile_dependencies runs (it exits when make fails).
    from megatron.core.datasets import utils as dataset_utils

    dataset_utils.compile_helpers = lambda: None
    # Megatron-LM's legacy CUDA kernels (masked softmax) are compiled with nvcc at start-up;
    # nothing uses them with --no-masked-softmax-fusion, and there is no nvcc here.
    from megatron.legacy import fused_kernels

    fused_kernels.load = lambda args: None


def _wrap_load() -> None:
    """load_checkpoint under torch.no_grad(), with torch Adam's three corrections."""
    import functools

    import torch
    from megatron.training import training  # type: ignore[import-not-found]

    from megatron_trainer import optim_compat

    load = training.load_checkpoint

    @functools.wraps(load)
    def load_checkpoint(model: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        if optimizer is not None:
            optim_compat.prepare_for_load(optimizer)
            load_state_dict = optimizer.load_state_dict

            def corrected(state: Any) -> None:
                optimizer.load_state_dict = load_state_dict  # the real one, inside
                try:
                    optim_compat.load_optimizer_state(optimizer, state)
                finally:
                    optimizer.load_state_dict = corrected

            optimizer.load_state_dict = corrected
        with torch.no_grad():
            return load(model, optimizer, *args, **kwargs)

    training.load_checkpoint = load_checkpoint


class _NoStream:
    """A CUDA stream on CPU: work is synchronous, so there is nothing to wait for."""

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def _with_six() -> None:
    try:
        import six  # noqa: F401
    except ImportError:
        sys.modules["six"] = types.ModuleType("six")


def _tensors(state: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {k: v.detach().clone() for k, v in state.items() if isinstance(v, torch.Tensor)}


def main() -> int:
    root = os.environ[SOURCE_ENV]
    sys.path.append(root)  # after site-packages: megatron.core stays the installed 0.16.1
    _with_six()
    import torch

    _install_cpu_shims()
    from functools import partial

    import megatron.core
    from gpt_builders import gpt_builder  # type: ignore[import-not-found]
    from megatron.core.enums import ModelType
    from megatron.training import get_args  # type: ignore[import-not-found]
    from megatron.training.checkpointing import save_checkpoint  # type: ignore[import-not-found]
    from megatron.training.initialize import initialize_megatron  # type: ignore[import-not-found]
    from megatron.training.training import (  # type: ignore[import-not-found]
        setup_model_and_optimizer,
    )
    from model_provider import model_provider  # type: ignore[import-not-found]

    assert not megatron.core.__file__.startswith(root), "megatron.core must be the installed one"
    _wrap_load()
    initialize_megatron(allow_no_cuda=True)
    args = get_args()
    model, optimizer, scheduler = setup_model_and_optimizer(
        partial(model_provider, gpt_builder), ModelType.encoder_or_decoder
    )
    rank = torch.distributed.get_rank()
    report = {
        "rank": rank,
        "iteration": args.iteration,
        "consumed_train_samples": args.consumed_train_samples,
        "scheduler": {k: v for k, v in scheduler.state_dict().items() if not callable(v)},
        "lr": optimizer.param_groups[0]["lr"],
        "model_chunks": len(model),
    }
    if args.save:
        save_checkpoint(
            args.iteration, model, optimizer, scheduler, args.num_floating_point_operations_so_far
        )
    out = Path(os.environ[REPORT_ENV]) / f"rank{rank}.json"
    out.write_text(json.dumps(report, default=str))
    torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
