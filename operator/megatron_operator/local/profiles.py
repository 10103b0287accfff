"""`mjob profiles`: find a job's profiler captures and copy them out.

Captures live in <checkpoint dir>/profiles/<restart attempt>/rank<N>.<suffix>, one a profiled rank
(torch and viztracer: Chrome traces; nsys: .nsys-rep reports), on the job's volume or under its
checkpoint URL. The reading goes through the trainer's storage layer, so a directory and an
msc:// URL (with MSC_CONFIG) look the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from megatron_contract.paths import PROFILES_DIR


@dataclass(frozen=True)
class Capture:
    attempt: int
    name: str  # rank<N>.<suffix>
    size: int | None
    source: str  # where it is: a path or an msc:// URL


def find(checkpoint_dir: str) -> list[Capture]:
    """Every capture under the checkpoint directory, by attempt then rank."""
    from megatron_trainer.storage import storage_for

    store = storage_for(checkpoint_dir)
    root = store.join(checkpoint_dir, PROFILES_DIR)
    found = []
    for relative in store.files(root):
        attempt, _, name = relative.partition("/")
        if not attempt.isdigit() or not name or "/" in name:
            continue  # not ours: captures sit directly in profiles/<attempt>/
        source = store.join(root, attempt, name)
        found.append(Capture(int(attempt), name, store.size(source), source))
    return sorted(found, key=lambda c: (c.attempt, _rank_of(c.name), c.name))


def _rank_of(name: str) -> int:
    head = name.split(".", 1)[0]
    return int(head[4:]) if head.startswith("rank") and head[4:].isdigit() else -1


def copy_out(captures: list[Capture], destination: Path) -> list[Path]:
    """Copy captures to destination/<attempt>/<name>; returns the files written."""
    from megatron_trainer.storage import storage_for

    written = []
    for c in captures:
        target = destination / str(c.attempt) / c.name
        target.parent.mkdir(parents=True, exist_ok=True)
        storage_for(c.source).download(c.source, os.fspath(target))
        written.append(target)
    return written
