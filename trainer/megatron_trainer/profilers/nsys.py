"""NVIDIA Nsight Systems, as Megatron Bridge runs it: the launcher starts each listed rank's
process under `nsys profile --capture-range=cudaProfilerApi` (`command`), and this plugin opens
and closes the capture range with cudaProfilerStart/Stop around the profiled steps. nsys writes
the .nsys-rep itself when the rank's process exits, so `save` has nothing to do.

Stdlib only at import time: the launcher (which imports no torch) builds the command from here.
"""

from __future__ import annotations

from collections.abc import Sequence

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

    def start(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()  # type: ignore[no-untyped-call]

    def save(self, path: str) -> None:
        """nsys writes the report at process exit (see `command`)."""
