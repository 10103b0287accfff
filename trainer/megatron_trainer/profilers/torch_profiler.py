"""torch.profiler: CPU (and CUDA) operators with shapes, as a Chrome trace."""

from __future__ import annotations

from typing import Any


class Plugin:
    suffix = "torch.json"

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.profiler: Any = None

    def start(self) -> None:
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
        self.profiler.__enter__()

    def stop(self) -> None:
        self.profiler.__exit__(None, None, None)

    def save(self, path: str) -> None:
        self.profiler.export_chrome_trace(path)
