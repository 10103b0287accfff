"""The progress file any training code can append to (docs/bring-your-own-code.md), and its one
parser (stdlib only).

With spec.trainer.command the launcher sets MEGATRON_PROGRESS_LOG to a file, and rank 0 appends
one line per step to it:

    ITERATION [LOSS] [tokens_per_second=X] [mfu=X] [checkpoint=ITERATION]

e.g. `1200 2.314` or `1200 loss=2.314 checkpoint=1000`. A line that does not parse is skipped,
so a stray print cannot break anything. The launcher on node 0 forwards each new step as the
progress record the built-in trainer writes (contract §4): the hang rule, `kubectl get mj`
PROGRESS and the dashboard work for any code that writes these lines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from megatron_contract.bounds import MAX_ITERATIONS

MAX_LINE: Final = 4096  # longer lines are skipped
_KEYS: Final = {
    "loss": "loss",
    "tokens_per_second": "tokens_per_second",
    "tokensPerSecond": "tokens_per_second",
    "mfu": "mfu",
    "checkpoint": "checkpoint_iteration",
    "checkpointIteration": "checkpoint_iteration",
}


@dataclass(frozen=True)
class Step:
    iteration: int
    loss: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None
    checkpoint_iteration: int | None = None


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _step_count(text: str) -> int | None:
    if not text.isdigit() or len(text) > 12:
        return None
    value = int(text)
    return value if value <= MAX_ITERATIONS else None


def parse_line(line: str) -> Step | None:
    """One line, or None when it is not a progress line."""
    if len(line) > MAX_LINE:
        return None
    words = line.split()
    if not words:
        return None
    iteration = _step_count(words[0])
    if iteration is None:
        return None
    values: dict[str, float | int | None] = {}
    for i, word in enumerate(words[1:]):
        key, eq, raw = word.partition("=")
        if not eq:
            if i == 0:
                values["loss"] = _number(word)
                continue
            return None
        field = _KEYS.get(key)
        if field is None:
            continue  # an unknown key: ignored, so code may log more than we read
        if field == "checkpoint_iteration":
            values[field] = _step_count(raw)
        else:
            values[field] = _number(raw)
    return Step(
        iteration,
        loss=_float(values.get("loss")),
        tokens_per_second=_float(values.get("tokens_per_second")),
        mfu=_float(values.get("mfu")),
        checkpoint_iteration=_int(values.get("checkpoint_iteration")),
    )


def _float(value: float | int | None) -> float | None:
    return float(value) if value is not None else None


def _int(value: float | int | None) -> int | None:
    return int(value) if isinstance(value, int) else None
