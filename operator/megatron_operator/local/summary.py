"""The run's record: losses from the progress file, checkpoints on disk, summary.json, a plot."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_contract.paths import ITER_DIR_RE


@dataclass
class ProgressLog:
    """Follows the trainer's progress file (one JSON object per line, appended by rank 0)."""

    path: Path
    offset: int = 0
    losses: dict[int, float] = field(default_factory=dict)  # iteration → newest loss
    latest: dict[str, Any] | None = None
    checkpoints: set[int] = field(default_factory=set)  # the checkpoint steps reported

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            return []  # a partial line: wait for the rest
        self.offset += end + 1
        records = []
        for line in chunk[: end + 1].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("iteration"), int):
                records.append(rec)
                loss = rec.get("loss")
                if isinstance(loss, (int, float)):
                    # A step recomputed after a resume replaces its earlier value.
                    self.losses[rec["iteration"]] = float(loss)
                step = rec.get("checkpointIteration")
                if isinstance(step, int):
                    self.checkpoints.add(step)
                self.latest = rec
        return records


def complete_checkpoints(directory: Path | str) -> list[int]:
    """Iterations with a complete checkpoint (both metadata files present): in a directory, or
    under an msc:// URL (through the trainer's storage, with the run's MSC_CONFIG)."""
    if isinstance(directory, str):
        from megatron_trainer.storage import storage_for

        store = storage_for(directory)
        found = []
        for name in store.names(directory):
            m = ITER_DIR_RE.match(name)
            url = store.join(directory, name)
            if m and all(
                store.size(store.join(url, f)) is not None for f in ("metadata.json", ".metadata")
            ):
                found.append(int(m.group(1)))
        return sorted(found)
    if not directory.is_dir():
        return []
    out = []
    for child in directory.iterdir():
        m = ITER_DIR_RE.fullmatch(child.name)
        if m and (child / "metadata.json").exists() and (child / ".metadata").exists():
            out.append(int(m.group(1)))
    return sorted(out)


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


def plot_losses(path: Path, losses: dict[int, float], restarts_at: list[int], title: str) -> bool:
    """A loss-curve PNG; restarts are marked. False when there is nothing to plot."""
    if not losses:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = sorted(losses)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(xs, [losses[x] for x in xs], color="#1f77b4", linewidth=1.5, label="loss")
    for i, step in enumerate(restarts_at):
        ax.axvline(
            step, color="#d62728", linestyle="--", linewidth=1, label="restart" if i == 0 else None
        )
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
