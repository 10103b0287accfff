"""Progress from Megatron-LM's and Megatron Bridge's own log lines (stdlib only; Python 3.8+).

Megatron-LM's `training_log` (megatron/training/training.py) prints, on the LAST rank only
(`print_rank_last`), once per `--log-interval`:

    [2026-11-02 10:00:00.123456] iteration      100/    1000 | consumed samples: ... |
    elapsed time per iteration (ms): 812.3 | ... | lm loss: 2.314000E+00 | loss scale: 1.0 | ...

and rank 0 prints `successfully saved checkpoint from iteration     100 to ...` after a save
and `successfully loaded checkpoint from ... at iteration 100` after a load. Megatron Bridge's
training loop prints the same `iteration N/ M | ... | lm loss: X |` line. The launchers read
their ranks' output (launcher.py) and hand each line here: no change to the user's code or flags.

The lines are the tenant's output: a line is looked at only up to MAX_LINE characters, numbers are
bounded, and nothing here raises on any input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from megatron_contract.bounds import MAX_ITERATIONS

MAX_LINE = 8192  # Megatron-LM's line is ~400 characters; a longer one is cut to this
_ITERATION = re.compile(r"\biteration\s{0,16}(\d{1,12})\s{0,4}/\s{0,16}(\d{1,12})\s{0,4}\|")
# The loss the job reports: `lm loss` (GPT), else the first `<name> loss:` field.
_LM_LOSS = re.compile(r"\|\s{0,4}lm loss:\s{0,4}([^\s|]{1,32})\s{0,4}\|")
_ANY_LOSS = re.compile(r"\|\s{0,4}[\w -]{0,40}\bloss:\s{0,4}([^\s|]{1,32})\s{0,4}\|")
_SAVED = re.compile(r"successfully saved checkpoint from iteration\s{0,16}(\d{1,12})\b")
_LOADED = re.compile(
    r"successfully loaded checkpoint from .{0,4096}? at iteration\s{0,4}(\d{1,12})\b"
)


@dataclass(frozen=True)
class LogStep:
    """What one line said: a training step (with its loss when printed), or a checkpoint."""

    iteration: int | None = None
    loss: float | None = None
    saved: int | None = None  # a checkpoint of this iteration was saved
    loaded: int | None = None  # the ranks resumed from this iteration


def _count(text: str) -> int | None:
    value = int(text)
    return value if value <= MAX_ITERATIONS else None


def _loss(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_line(line: str) -> LogStep | None:
    """One line of a rank's output, or None when it says nothing about progress. Never raises."""
    line = line[:MAX_LINE]
    if "iteration" not in line:
        return None
    m = _ITERATION.search(line)
    if m is not None:
        iteration = _count(m.group(1))
        if iteration is None:
            return None
        rest = line[m.end() - 1 :]
        loss_match = _LM_LOSS.search(rest) or _ANY_LOSS.search(rest)
        loss = _loss(loss_match.group(1)) if loss_match else None
        return LogStep(iteration=iteration, loss=loss)
    m = _SAVED.search(line)
    if m is not None:
        saved = _count(m.group(1))
        return LogStep(saved=saved) if saved is not None else None
    m = _LOADED.search(line)
    if m is not None:
        loaded = _count(m.group(1))
        return LogStep(loaded=loaded) if loaded is not None else None
    return None
