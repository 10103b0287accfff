"""Whether this process may fork a child that will use torch (the zygote's ranks, a rank's
checkpoint writer). Standard library only."""

from __future__ import annotations

import os
import sys


def fork_unsafe() -> str:
    """Why forking ranks from this process would be unsafe, or "" when it is safe: a CUDA driver
    initialised here is unusable in a forked child, and a fork copies only the calling thread
    (a lock held by another thread stays held for ever in the child)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the imports initialised CUDA (torch)"
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            cuda_loaded = "libcuda.so" in maps.read()
    except OSError:
        cuda_loaded = False
    if cuda_loaded:
        import ctypes

        count = ctypes.c_int(0)
        # Without cuInit the driver answers CUDA_ERROR_NOT_INITIALIZED (3): loaded, never started.
        if ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) != 3:
            return "the imports initialised the CUDA driver"
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        return f"the imports started {threads - 1} thread(s)"
    return ""
