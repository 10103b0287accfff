"""Profiler plugins: what `profiling.tool` names, behind one small interface.

A plugin starts before step `startStep`, stops after step `endStep` and saves one capture for its
rank. Adding a profiler is one module here with a class that has `suffix`, `start`, `stop` and
`save`, plus its name in `megatron_contract.choices.PROFILERS` (which the API and the CEL read).
Plugins import their library lazily, so a job that profiles nothing never loads it.
"""

from __future__ import annotations

import importlib
from typing import Protocol


class Profiler(Protocol):
    suffix: str  # the capture's file name after `rank<N>.`

    def start(self) -> None:
        """Begin capturing (before the first profiled step)."""

    def stop(self) -> None:
        """Stop capturing (after the last profiled step)."""

    def save(self, path: str) -> None:
        """Write the capture to `path` (a local file)."""


# tool name -> module of this package holding its `Plugin` class
PLUGINS = {"torch": "torch_profiler", "viztracer": "viztracer_profiler", "nsys": "nsys"}


def load(tool: str, cuda: bool) -> Profiler:
    """A new profiler for `tool` (a choice the config parser already checked)."""
    module = importlib.import_module(f"{__name__}.{PLUGINS[tool]}")
    plugin: Profiler = module.Plugin(cuda)
    return plugin


def capture_name(rank: int, suffix: str) -> str:
    """`rank0.viztracer.json`: one capture a rank, in profiles/<restart attempt>/."""
    return f"rank{rank}.{suffix}"
