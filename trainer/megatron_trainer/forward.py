"""Progress of code we did not write, reported as the built-in trainer reports its own (a stdout
line, the local progress file, the job's Lease), from two sources:
- the file a trainer.command appends `ITERATION [LOSS] …` lines to (MEGATRON_PROGRESS_LOG), which
  a thread polls (`Forwarder`); rank 0 writes it, so the launcher of node 0 follows it;
- the ranks' own output (agent/output.py): Megatron-LM's and Megatron Bridge's `iteration N/ M |
  ... | lm loss: X |` lines, printed by the last rank only, and rank 0's `successfully saved
  checkpoint from iteration N` (`LogProgress`, in the launcher that holds the last rank).
Both feed one `Steps`, which keeps the steps of an attempt moving forward. Stdlib only (3.8+).

Nothing in either source can stop the launcher: bad lines are skipped, a file that grows fast
is read in bounded chunks, I/O errors are logged.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Final

from megatron_contract.bounds import MAX_ITERATIONS
from megatron_contract.megatron_log import parse_line as parse_log_line
from megatron_contract.paths import TRACKER_FILE
from megatron_contract.progress_log import MAX_LINE, Step, parse_line
from megatron_contract.timeline import Clock

from .progress import ProgressReporter, Report

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.5
CHUNK: Final = 1 << 20  # bytes read per poll at most


class Steps:
    """The steps of the current attempt, from any source, forwarded in order (thread-safe)."""

    def __init__(self, reporter: ProgressReporter) -> None:
        self.reporter = reporter
        self.lock = threading.Lock()
        self.last: int | None = None  # the newest step forwarded in this attempt
        self.checkpoint: int | None = None  # the newest checkpoint named, carried forward
        # When this attempt's ranks started: the one fact of the process's timeline the
        # launcher knows (contract §4, `clock`); the rest is not reported by the code.
        self.began = time.time()

    def restart(self, attempt: int) -> None:
        """The ranks of `attempt` start (in place): its steps start over."""
        with self.lock:
            if attempt != self.reporter.attempt:
                self.reporter.attempt = attempt
                self.last = None
                self.began = time.time()

    def saved(self, iteration: int) -> None:
        with self.lock:
            self.checkpoint = max(self.checkpoint or 0, iteration)

    def step(self, step: Step) -> bool:
        """Forward `step` unless it does not move forward; True when forwarded."""
        with self.lock:
            if self.last is not None and step.iteration <= self.last:
                return False  # steps only move forward within an attempt
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
            return True

    def close(self) -> None:
        self.reporter.close()


class Forwarder:
    """Follows the progress file (MEGATRON_PROGRESS_LOG) from a thread."""

    def __init__(self, path: str, steps: Steps, poll: float = POLL_SECONDS) -> None:
        self.path = path
        self.steps = steps
        self.poll = poll
        self.offset = 0
        self.partial = b""
        self.skipped = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="progress-forward", daemon=True)

    def start(self) -> Forwarder:
        self.thread.start()
        return self

    def close(self) -> None:
        """Forward what the file holds now, then stop."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5.0)
        self.read()

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
        self.steps.step(step)


TRACKER_MAX = 64  # bytes read of Megatron-LM's latest_checkpointed_iteration.txt


class LogProgress:
    """Megatron-LM's and Bridge's log lines (megatron_contract.megatron_log) as steps.

    `reporting`: the local rank whose `iteration` lines count (the job's last rank, which prints
    them), or None when the last rank is in another pod. Checkpoint lines count from any local
    rank (rank 0 prints them). `save_dir`: the `--save` directory of the last rank's command,
    whose tracker file names the newest complete checkpoint when rank 0 is in another pod."""

    def __init__(self, steps: Steps, reporting: int | None, save_dir: str | None = None) -> None:
        self.steps = steps
        self.reporting = reporting
        self.save_dir = save_dir
        self.tracker_stamp: tuple[int, int] | None = None
        self.lines = 0

    def line(self, local: int, text: str) -> None:
        found = parse_log_line(text)
        if found is None:
            return
        if found.saved is not None or found.loaded is not None:
            self.steps.saved(found.saved if found.saved is not None else found.loaded or 0)
            return
        if found.iteration is None or local != self.reporting:
            return
        self._read_tracker()
        self.lines += 1
        self.steps.step(Step(found.iteration, loss=found.loss))

    def _read_tracker(self) -> None:
        if self.save_dir is None:
            return
        path = os.path.join(self.save_dir, TRACKER_FILE)
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self.tracker_stamp:
                return
            with open(path, "rb") as f:
                text = f.read(TRACKER_MAX).decode("ascii", errors="replace").strip()
            self.tracker_stamp = stamp
        except OSError:
            return
        if text.isdigit() and len(text) <= 12 and int(text) <= MAX_ITERATIONS:
            self.steps.saved(int(text))


def save_dir_of(argv: Sequence[str]) -> str | None:
    """The value of Megatron-LM's `--save DIR` (or `--save=DIR`) in a rank's argv."""
    for i, arg in enumerate(argv):
        if arg == "--save" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--save="):
            return arg[len("--save=") :] or None
    return None


def progress_log_path(directory: str | None = None) -> str:
    """A fresh, empty file for this launcher's ranks (one per pod, one per attempt)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="megatron-progress-", suffix=".log", dir=directory)
    os.close(fd)
    return path
