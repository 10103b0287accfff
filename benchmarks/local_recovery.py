"""Time from a kill to the first resumed step, for `mjob run --local` on the CPU example.

Runs `mjob run examples/cpu-tiny.yaml --local --inject-failure STEP:RANK` and reads the run's
progress file and logs: the kill happens when rank 0 reports STEP; recovery ends when the next
attempt reports its first step. Goal (issue 5): ≤ 20 s. The figure includes the restart backoff
of the example (1 s), the new processes' imports and gloo rendezvous, and the checkpoint load.

Run: python benchmarks/local_recovery.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP = 12


def one_run(workdir: Path) -> tuple[float, float]:
    """(kill → first resumed step, the backoff part of it) in seconds. Progress times have 1 s
    resolution, so each figure is ±1 s."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_operator.cli.main",
            "run",
            str(REPO / "examples" / "cpu-tiny.yaml"),
            "--local",
            "--workdir",
            str(workdir),
            "--inject-failure",
            f"{STEP}:1",
            "--set",
            "training.trainIters=20",
            "--set",
            "checkpoint.saveInterval=5",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"mjob run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (workdir / "progress.jsonl").read_text().splitlines()]
    times = [datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() for r in records]
    iters = [r["iteration"] for r in records]
    killed_at = next(t for t, i in zip(times, iters, strict=True) if i >= STEP)
    # The first report whose iteration went backwards is the resumed attempt's first step.
    first_resumed = next(
        t for k, (t, i) in enumerate(zip(times, iters, strict=True)) if k and i < iters[k - 1]
    )
    started = re.search(r"restarting all pods in ([0-9.]+)s", proc.stdout)
    backoff = float(started.group(1)) if started else 0.0
    return first_resumed - killed_at, backoff


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"machine: {platform.node()}, python {platform.python_version()}; kill rank 1 at step {STEP}"
    )
    results = []
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="mjob-recovery-") as d:
            recovery, backoff = one_run(Path(d))
        results.append(recovery)
        print(
            f"run {i + 1}: kill → first resumed step {recovery:.1f} s (of which backoff {backoff:g} s)"
        )
    print(
        f"kill → first resumed step: median {statistics.median(results):.1f} s, "
        f"best {min(results):.1f} s, worst {max(results):.1f} s (goal ≤ 20 s)"
    )


if __name__ == "__main__":
    main()
