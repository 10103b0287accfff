"""NVIDIA Nsight Systems, as Megatron Bridge runs it: the launcher starts each listed rank's
process under `nsys profile --capture-range=cudaProfilerApi` (`command`), and this plugin opens
and closes the capture range with cudaProfilerStart/Stop around the profiled steps. Inside the
range, `torch.autograd.profiler.emit_nvtx(record_shapes=True)` is entered after the start, as
Megatron-LM (training.py, `--profile`) and Bridge do: without it `-t nvtx` records no per-op
ranges. nsys writes the .nsys-rep itself when the rank's process exits, so `save` has nothing to
do.

The window is steps startStep..endStep, both included: one step wider than Megatron-LM's
`--profile-step-start S --profile-step-end E`, which opens the range before step S+1 (its
iteration counter is the steps done) and closes it after step E.

Stdlib only at import time: the launcher (which imports no torch) builds the command from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NSYS = "nsys"
SUFFIX = "nsys-rep"
# Megatron Bridge's (NeMo-Run NsysPlugin's) defaults: CUDA and NVTX traces, no CPU sampling, a
# capture range the trainer opens and closes, and the process ends the capture at the stop.
TRACE = "nvtx,cuda"


def command(output_base: str, rank_command: Sequence[str]) -> list[str]:
    """The rank's command under nsys; the report is `output_base` + ".nsys-rep"."""
    return [
        NSYS,
        "profile",
        "-s",
        "none",
        "-t",
        TRACE,
        "-o",
        output_base,
        "--force-overwrite",
        "true",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        *rank_command,
    ]


class Plugin:
    suffix = SUFFIX

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.nvtx: Any = None

    def start(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()  # type: ignore[no-untyped-call]
        self.nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True)  # type: ignore[no-untyped-call]
        self.nvtx.__enter__()

    def stop(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()  # type: ignore[no-untyped-call]
        if self.nvtx is not None:
            nvtx, self.nvtx = self.nvtx, None
            nvtx.__exit__(None, None, None)

    def save(self, path: str) -> None:
        """nsys writes the report at process exit (see `command`)."""
