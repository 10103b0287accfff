"""Helpers shared by the `cluster` driver and its modules (images, real nodes)."""

from __future__ import annotations

import sys
from typing import NoReturn


class CliError(Exception):
    """An error reported to the user as one clear message, without a traceback."""


def die(message: str) -> NoReturn:
    raise CliError(message)


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)
