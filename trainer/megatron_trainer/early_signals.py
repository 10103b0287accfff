"""A stop that comes before the launcher's own handlers exist (standard library only).

The launcher is its container's PID 1, and the kernel does not deliver a signal to a PID 1 that
has no handler for it. Without these, a pod deleted in its launcher's first moments (a spare
made and deleted at once, a job deleted while it starts) ignored the kubelet's SIGTERM and
waited out its whole termination grace period before the SIGKILL. `catch` runs first; each
place that installs the real handlers then replays what came (`replay`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType

_received: list[int] = []


def _note(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)


def catch() -> None:
    """Note SIGTERM and SIGINT until the real handlers are installed."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _note)


def replay(handler: Callable[[int, FrameType | None], object]) -> None:
    """Call `handler` (now installed) for the first stop that came before it."""
    if _received:
        handler(_received[0], None)
