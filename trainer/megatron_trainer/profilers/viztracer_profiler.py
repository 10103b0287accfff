"""VizTracer: every Python function call of the rank (Megatron Bridge's custom-profiler example),
as a Chrome trace that `vizviewer` or Perfetto opens. Runs on CPU too."""

from __future__ import annotations

from typing import Any

# Enough for a few steps of a real model; VizTracer drops the oldest entries beyond it.
TRACER_ENTRIES = 2_000_000


class Plugin:
    suffix = "viztracer.json"

    def __init__(self, cuda: bool) -> None:
        self.tracer: Any = None

    def start(self) -> None:
        from viztracer import VizTracer

        self.tracer = VizTracer(tracer_entries=TRACER_ENTRIES, verbose=0)
        self.tracer.start()

    def stop(self) -> None:
        self.tracer.stop()

    def save(self, path: str) -> None:
        self.tracer.save(path)
