"""Every Megatron-Core patch the CPU (gloo) platform needs, in one place, pinned to 0.16.1.

Megatron-Core assumes CUDA: it allocates with `device=torch.cuda.current_device()`, writes
`device="cuda"` literals, synchronizes streams and keeps its model-parallel RNG states in the CUDA
generator. On a machine without a GPU each of those raises "Found no NVIDIA driver".

We do not touch `torch` itself. Instead each affected Megatron-Core module gets its own stand-in for
the name `torch` (`_TorchOnCpu`), which forwards everything to the real torch except the CUDA calls
listed below, which it maps to their CPU meaning. Every redirect counts its uses per module
(`patch_hits`), so a test can show each patch is exercised by a real CPU training run (needed) and
that the run then succeeds (sufficient): tests/trainer/test_cpu_platform.py.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

MEGATRON_CORE_VERSION = "0.16.1"

# Module -> why it needs the CUDA-to-CPU stand-in. Found by running TP=2, PP=2 (also interleaved),
# DP=2 and MoE training with sync and async torch_dist saves and loads (dp_reshardable and
# fully_reshardable) on CPU with the stand-in in EVERY megatron.core module, and keeping exactly
# the modules whose redirects were used. tests/trainer/test_cpu_platform.py checks that each entry
# is still used (needed) and that those runs pass (sufficient).
PATCHED_MODULES: dict[str, str] = {
    "megatron.core.tensor_parallel.random": (
        "the RNG tracker keeps the model-parallel RNG states in the CUDA generator "
        "(torch.cuda.manual_seed/get_rng_state, _set_cuda_rng_state); on CPU the CPU generator "
        "is what dropout draws from"
    ),
    "megatron.core.utils": (
        "local_multi_tensor_l2_norm (the grad-norm kernel used without Apex) returns its result "
        "as torch.tensor(..., device='cuda')"
    ),
    "megatron.core.pipeline_parallel.schedules": (
        "every schedule counts tokens in torch.zeros([], device='cuda')"
    ),
    "megatron.core.pipeline_parallel.p2p_communication": (
        "PP send/recv buffers are allocated on torch.cuda.current_device() and each exchange "
        "ends with torch.cuda.synchronize()"
    ),
    "megatron.core.models.common.embeddings.rotary_pos_embedding": (
        "RoPE frequencies are created on torch.cuda.current_device()"
    ),
    "megatron.core.distributed.param_and_grad_buffer": (
        "DDP's parameter and gradient buffers are allocated on torch.cuda.current_device()"
    ),
    "megatron.core.optimizer.optimizer": (
        "the optimizer's unit loss scale is torch.tensor([1.0], device='cuda')"
    ),
    "megatron.core.optimizer.clip_grads": (
        "grad-norm and clipping use torch.zeros(..., device='cuda') accumulators"
    ),
    "megatron.core.tensor_parallel.mappings": (
        "the allgather MoE dispatcher with expert parallelism gathers the routing map into "
        "torch.empty(..., device=torch.cuda.current_device())"
    ),
    "megatron.core.transformer.moe.router": (
        "the MoE router moves its weights to torch.cuda.current_device() on every forward"
    ),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": (
        "the torch_dist save all-reduces its failure flag on torch.cuda.current_device()"
    ),
    "megatron.core.dist_checkpointing.strategies.filesystem_async": (
        "the checkpoint writer calls torch.cuda.synchronize() after staging tensors"
    ),
    "megatron.core.dist_checkpointing.strategies.async_utils": (
        "async-save bookkeeping all-reduces completion flags on torch.cuda.current_device(), "
        "and the persistent writer process selects its GPU with "
        "torch.cuda.set_device(rank % torch.cuda.device_count()) (a division by zero here)"
    ),
}

_hits: Counter[str] = Counter()
_hits_lock = threading.Lock()
_installed: set[str] = set()  # patch sites already installed (install() is idempotent)


def _hit(module: str, api: str) -> None:
    with _hits_lock:
        _hits[f"{module}:{api}"] += 1


def patch_hits() -> dict[str, int]:
    """How often each redirect was used, keyed `module:api` (for the platform test)."""
    with _hits_lock:
        return dict(_hits)


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    # A bare int is a CUDA ordinal in torch's factory functions.
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaOnCpu:
    """Stands in for `torch.cuda` inside one patched module."""

    def __init__(self, module: str) -> None:
        self._module = module

    def current_device(self) -> torch.device:
        _hit(self._module, "cuda.current_device")
        return torch.device("cpu")

    def synchronize(self, device: Any = None) -> None:
        # CPU kernels run synchronously: there is nothing to wait for.
        _hit(self._module, "cuda.synchronize")

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        _hit(self._module, "cuda.get_rng_state")
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        _hit(self._module, "cuda.set_rng_state")
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        _hit(self._module, "cuda.manual_seed")
        torch.manual_seed(seed)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _WriterCudaOnCpu(_CudaOnCpu):
    """`torch.cuda` of the async-save module: its writer process picks "its GPU" at start."""

    def device_count(self) -> int:
        _hit(self._module, "cuda.device_count")
        return 1

    def set_device(self, device: Any) -> None:
        _hit(self._module, "cuda.set_device")


_CUDA_STAND_INS: dict[str, type[_CudaOnCpu]] = {
    "megatron.core.dist_checkpointing.strategies.async_utils": _WriterCudaOnCpu,
}


def _factory(module: str, name: str) -> Callable[..., Any]:
    real = getattr(torch, name)

    def on_cpu(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            _hit(module, f"{name}(device=cuda)")
            kwargs["device"] = "cpu"
        kwargs.pop("pin_memory", None)  # pinning needs CUDA; host memory is already "pinned"
        return real(*args, **kwargs)

    return on_cpu


_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange")


class _TorchOnCpu:
    """Stands in for the `torch` module inside one patched Megatron-Core module."""

    def __init__(self, module: str) -> None:
        self.cuda = _CUDA_STAND_INS.get(module, _CudaOnCpu)(module)
        for name in _FACTORIES:
            setattr(self, name, _factory(module, name))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _cpu_rng_state_getter(module: str) -> Callable[..., torch.Tensor]:
    def get_state(device: Any = -1, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        _hit(module, "_get_cuda_rng_state")
        return torch.get_rng_state()

    return get_state


def _cpu_rng_state_setter(module: str) -> Callable[..., None]:
    def set_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
        _hit(module, "_set_cuda_rng_state")
        torch.set_rng_state(new_state)

    return set_state


_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}

# Functions that compare `tensor.type()` with CUDA type names and reject CPU tensors that work
# fine. They run with `tensor.type()` reporting CPU float tensors under their CUDA names.
TYPE_NAME_PATCHES: dict[tuple[str, str], str] = {
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer.__init__"): (
        "sorts parameters into fp32/fp16 groups by comparing param.type() with "
        "'torch.cuda.FloatTensor' and raises TypeError for CPU tensors"
    ),
    ("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32"): (
        "asserts grad.type() == 'torch.cuda.FloatTensor' before clipping, every step"
    ),
}


@contextlib.contextmanager
def _cuda_type_names(site: str) -> Iterator[None]:
    original = torch.Tensor.type

    def type_with_cuda_names(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if not args and not kwargs and name in _CUDA_TYPE_NAMES:
            _hit(site, "Tensor.type")
            return _CUDA_TYPE_NAMES[name]
        return name

    torch.Tensor.type = type_with_cuda_names  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.Tensor.type = original  # type: ignore[method-assign]


def _with_cuda_type_names(site: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _cuda_type_names(site):
            return fn(*args, **kwargs)

    return wrapper


def check_version() -> None:
    """The patches are only known to be complete for one Megatron-Core version."""
    from megatron.core import package_info

    found = package_info.__version__
    if found != MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"the CPU platform's Megatron-Core patches are pinned to megatron-core=="
            f"{MEGATRON_CORE_VERSION}, but {found} is installed; install the pinned version "
            "(pip install -e '.[trainer]' from a checkout of this repository) or re-verify the patches in "
            "megatron_trainer/platform/cpu.py"
        )


REPORT_ENV = "MEGATRON_CPU_PATCH_REPORT"


def _write_report(directory: str) -> None:
    path = os.path.join(directory, f"cpu-patch-hits-{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(patch_hits(), f, indent=1, sort_keys=True)


def install() -> None:
    """Install every patch (idempotent).

    With MEGATRON_CPU_PATCH_REPORT=DIR, each process writes its `patch_hits()` to DIR at exit
    (a diagnostic for tests and for re-verifying the patches on a new Megatron-Core).
    """
    check_version()
    report_dir = os.environ.get(REPORT_ENV)
    if report_dir and not _installed:
        atexit.register(_write_report, report_dir)
    for name in PATCHED_MODULES:
        if name in _installed:
            continue
        module = importlib.import_module(name)
        replacements: dict[str, Any] = {"torch": _TorchOnCpu(name)}
        if name == "megatron.core.tensor_parallel.random":
            # The tracker swaps states through these two helpers, which index
            # torch.cuda.default_generators directly; on CPU the CPU generator is the state.
            replacements["_get_cuda_rng_state"] = _cpu_rng_state_getter(name)
            replacements["_set_cuda_rng_state"] = _cpu_rng_state_setter(name)
        _installed.add(name)
        for key, value in replacements.items():
            setattr(module, key, value)
    for module_name, path in TYPE_NAME_PATCHES:
        key = f"{module_name}:{path}"
        if key in _installed:
            continue
        owner, attribute = _resolve(module_name, path)
        original = getattr(owner, attribute)
        _installed.add(key)
        setattr(owner, attribute, _with_cuda_type_names(f"{module_name}.{path}", original))


def _resolve(module_name: str, path: str) -> tuple[Any, str]:
    owner: Any = importlib.import_module(module_name)
    *parents, attribute = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, attribute
