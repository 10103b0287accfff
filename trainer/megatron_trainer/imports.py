"""Import Megatron-Core without paying for torch.compile at import time.

`megatron.core.jit` binds `jit_fuser = torch.compile`, and modules decorate their fusion kernels
with it at import. Merely creating those wrappers imports torch._dynamo and inductor: about 2-5 s
of every rank's start-up on this 2-core machine, paid again on every restart. The CPU platform
never calls those kernels (fusions are off) and on GPU they compile on first call anyway, so we
hand Megatron a torch.compile that builds the real compiled function on first call instead.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch


def _deferred_compile(model: Callable[..., Any] | None = None, **options: Any) -> Any:
    if model is None:  # used as @torch.compile(**options)
        return lambda fn: _deferred_compile(fn, **options)
    compiled: Callable[..., Any] | None = None

    @functools.wraps(model)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(model, **options)
        return compiled(*args, **kwargs)

    return call


def import_megatron_core() -> None:
    """Import megatron.core (once) with torch.compile deferred, then restore torch.compile."""
    if "megatron.core" in sys.modules:
        return
    real = torch.compile
    torch.compile = _deferred_compile
    try:
        import megatron.core
        import megatron.core.models.gpt  # noqa: F401 - the model stack imports the fusions
    finally:
        torch.compile = real
