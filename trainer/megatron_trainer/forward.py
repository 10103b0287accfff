"""Progress of code we did not write: the launcher follows the file a trainer.command appends
`ITERATION [LOSS] …` lines to (MEGATRON_PROGRESS_LOG) and reports each new step as the built-in
trainer does (a stdout line, the local progress file, the job's Lease). Stdlib only.

A thread polls the file: the ranks never wait on it, a file that grows fast is read in bounded
chunks, and nothing in it can stop the launcher (bad lines are skipped, I/O errors logged).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Final

from megatron_contract.progress_log import MAX_LINE, parse_line
from megatron_contract.timeline import Clock

from .progress import ProgressReporter, Report

log = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.5
CHUNK: Final = 1 << 20  # bytes read per poll at most


class Forwarder:
    def __init__(
        self,
        path: str,
        reporter: ProgressReporter,
        poll: float = POLL_SECONDS,
        began: float | None = None,
    ) -> None:
        self.path = path
        # When the ranks started: the one fact of the process's timeline the launcher knows
        # (contract §4, `clock`); the rest is not reported by the code.
        self.began = began if began is not None else time.time()
        self.reporter = reporter
        self.poll = poll
        self.offset = 0
        self.partial = b""
        self.last: int | None = None  # the newest step forwarded
        self.checkpoint: int | None = None  # the newest checkpoint a line named, carried forward
        self.skipped = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress-forward", daemon=True)

    def start(self) -> Forwarder:
        self.thread.start()
        return self

    def close(self) -> None:
        """Forward what the file holds now, then stop (the reporter flushes its Lease write)."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5.0)
        self.read()
        self.reporter.close()

    def _run(self) -> None:
        while not self.stopping.wait(self.poll):
            self.read()

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(CHUNK)
        except OSError as err:
            if not isinstance(err, FileNotFoundError):
                log.warning("cannot read the progress log %s: %s", self.path, err)
            return
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()  # the unfinished last line, kept for the next read
        if len(self.partial) > MAX_LINE:
            self.partial = b""  # a line without end: drop it rather than grow without bound
        for raw in lines:
            self._line(raw.decode("utf-8", errors="replace"))

    def _line(self, text: str) -> None:
        step = parse_line(text)
        if step is None:
            if text.strip():
                self.skipped += 1
                if self.skipped == 1:
                    log.warning(
                        "skipping a progress log line that is not ITERATION [LOSS]: %r", text[:80]
                    )
            return
        if self.last is not None and step.iteration <= self.last:
            return  # steps only move forward within an attempt
        first = self.last is None  # this attempt's first step (after a resume, not step 0)
        self.last = step.iteration
        if step.checkpoint_iteration is not None:
            self.checkpoint = max(self.checkpoint or 0, step.checkpoint_iteration)
        report = Report(
            step.iteration,
            step.loss,
            step.tokens_per_second,
            step.mfu,
            self.checkpoint,
            Clock(now=time.time(), began=self.began),
        )
        self.reporter.report(report, force=first)


def progress_log_path(directory: str | None = None) -> str:
    """A fresh, empty file for this launcher's ranks (one per pod, one per attempt)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="megatron-progress-", suffix=".log", dir=directory)
    os.close(fd)
    return path
