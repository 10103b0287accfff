"""Where a trainer process's time went, carried in its progress record (docs/contract.md §4).

Rank 0 adds one small object, `clock`, to each progress record: the record's own time with
millisecond precision, when the process began, when its training loop began (the first step's
start) and from which step, and the seconds it spent in the rendezvous, loading the checkpoint
and blocked saving checkpoints so far. The operator's goodput ledger (core/ledger.py) splits the
job's wall time with these facts; nothing else reads them.

Every field is cumulative or fixed for the life of the process, so any one record says all of
it: a record the operator never sees (the Lease keeps only the newest one) loses nothing.

Code other than the built-in trainer (a trainer.command) gets `now` and `began` from its
launcher and nothing more: the rest is "not reported by the code".

The operator parses this as tenant data: `parse_clock` never raises and bounds every number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from megatron_contract.bounds import MAX_ITERATIONS

KEY: Final = "clock"  # the record's key
# Epoch seconds in [2000, 2200): outside that range a clock is wrong, and the value unused.
_EPOCH_MIN: Final = 946_684_800.0
_EPOCH_MAX: Final = 7_258_118_400.0
_MAX_SECONDS: Final = 10.0**8  # about three years: a duration beyond it is nonsense


@dataclass(frozen=True)
class Clock:
    now: float  # this record's time (Unix seconds)
    began: float | None = None  # the process started (or a standby rank was released)
    loop: float | None = None  # the training loop began: the first step's start
    start: int | None = None  # the step the loop resumed after (0: from scratch)
    rendezvous: float | None = None  # seconds forming the process groups
    load: float | None = None  # seconds loading the checkpoint (or the initial weights)
    save: float | None = None  # seconds the loop was blocked saving checkpoints, so far

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"now": round(self.now, 3)}
        for key, value in (
            ("began", self.began),
            ("loop", self.loop),
            ("rdzv", self.rendezvous),
            ("load", self.load),
            ("save", self.save),
        ):
            if value is not None:
                body[key] = round(value, 3)
        if self.start is not None:
            body["start"] = self.start
        return body


def _epoch(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) and _EPOCH_MIN <= f < _EPOCH_MAX else None


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) and 0.0 <= f <= _MAX_SECONDS else None


def _step(value: object) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ITERATIONS
    return value if ok else None  # type: ignore[return-value]


def parse_clock(value: object) -> Clock | None:
    """The record's `clock`, or None when absent or without a usable `now`. A field that is
    not in range is dropped alone. Never raises."""
    if not isinstance(value, dict):
        return None
    now = _epoch(value.get("now"))
    if now is None:
        return None
    return Clock(
        now=now,
        began=_epoch(value.get("began")),
        loop=_epoch(value.get("loop")),
        start=_step(value.get("start")),
        rendezvous=_seconds(value.get("rdzv")),
        load=_seconds(value.get("load")),
        save=_seconds(value.get("save")),
    )
