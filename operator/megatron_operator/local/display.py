"""What `mjob run --local` shows: a live panel on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


class Display:
    """Plain lines (no redraw): for pipes, CI logs and files."""

    def __init__(self, job: str, train_iters: int | None, stream: TextIO | None = None) -> None:
        self.job = job
        self.train_iters = train_iters
        self.stream = stream or sys.stdout
        self.attempt = 0
        self.checkpoint: int | None = None
        self.started = time.monotonic()

    def line(self, rec: dict[str, Any]) -> str:
        if isinstance(rec.get("checkpointIteration"), int):
            self.checkpoint = rec["checkpointIteration"]
        return (
            f"[attempt {self.attempt}] iteration {self.of(rec['iteration'])}  "
            f"loss {_fmt(rec.get('loss'), '.4f')}  tokens/s {_fmt(rec.get('tokensPerSecond'), '.0f')}  "
            f"checkpoint {self.checkpoint if self.checkpoint is not None else '-'}"
        )

    def of(self, iteration: object) -> str:
        """`12/60`, or `12` when the total is not known (a trainer.command without training)."""
        return f"{iteration}/{self.train_iters}" if self.train_iters else str(iteration)

    def progress(self, rec: dict[str, Any]) -> None:
        print(self.line(rec), file=self.stream, flush=True)

    def event(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def set_attempt(self, attempt: int) -> None:
        self.attempt = attempt

    def close(self) -> None:
        pass


class LiveDisplay(Display):
    """A panel redrawn in place on a terminal, with the event log above it."""

    def __init__(self, job: str, train_iters: int | None) -> None:
        super().__init__(job, train_iters)
        self.console = Console()
        self.latest: dict[str, Any] | None = None
        self.live = Live(
            self._render(), console=self.console, refresh_per_second=8, transient=False
        )
        self.live.start()

    def _render(self) -> Group:
        table = Table(title=f"MegatronJob {self.job} (local)", show_header=True, expand=False)
        for col in ("attempt", "iteration", "loss", "tokens/s", "checkpoint", "elapsed"):
            table.add_column(col, justify="right")
        rec = self.latest or {}
        done = rec.get("iteration", 0)
        table.add_row(
            str(self.attempt),
            self.of(done),
            _fmt(rec.get("loss"), ".4f"),
            _fmt(rec.get("tokensPerSecond"), ".0f"),
            str(self.checkpoint) if self.checkpoint is not None else "-",
            f"{time.monotonic() - self.started:.0f}s",
        )
        width = 30
        filled = int(width * min(done / max(self.train_iters or done or 1, 1), 1.0))
        bar = Text("█" * filled + "░" * (width - filled), style="green")
        return Group(table, bar)

    def progress(self, rec: dict[str, Any]) -> None:
        self.line(rec)  # keeps the checkpoint column current
        self.latest = rec
        self.live.update(self._render())

    def event(self, text: str) -> None:
        self.live.console.print(text)
        self.live.update(self._render())

    def set_attempt(self, attempt: int) -> None:
        super().set_attempt(attempt)
        self.live.update(self._render())

    def close(self) -> None:
        self.live.update(self._render())
        self.live.stop()


def make_display(job: str, train_iters: int | None) -> Display:
    if sys.stdout.isatty():
        return LiveDisplay(job, train_iters)
    return Display(job, train_iters)
