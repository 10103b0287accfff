"""Time from a kill to the first resumed step, for `mjob run --local` on the CPU example, for
both restart strategies: InPlace (the ranks restart inside the running launcher process, forked
by its zygote) and Recreate (the launcher process is replaced, cold).

Runs `mjob run examples/cpu-tiny.yaml --local --inject-failure STEP:1` and reads rank 0's log
(millisecond timestamps): the kill happens when rank 0 logs STEP (the runner follows the progress
file every 0.1 s and kills rank 1 at once); recovery ends at the next attempt's first logged
step. Goal: ≤ 20 s. The figure includes the example's 1 s backoff, the gloo rendezvous, the
checkpoint load and one step; Recreate also the new processes' imports.

Run: python benchmarks/local_recovery.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP = 40  # a kill well into the run, past the first checkpoints
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \[rank 0\] INFO \S+: iteration (\d+)/")


def steps(logs: Path) -> list[tuple[float, int]]:
    """(time, iteration) of every step rank 0 logged, in the order of the log files."""
    found = []
    for path in sorted(logs.glob("attempt-*/*-0.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if m:
                when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((when, int(m.group(2))))
    return found


def one_run(workdir: Path, strategy: str) -> float:
    proc = subprocess.run(
        [
            sys.executable, "-m", "megatron_operator.cli.main", "run",
            str(REPO / "examples" / "cpu-tiny.yaml"), "--local", "--workdir", str(workdir),
            "--inject-failure", f"{STEP}:1",
            "--set", f"training.trainIters={STEP + 5}",
            "--set", "checkpoint.saveInterval=5",
            "--set", f"restartPolicy.strategy={strategy}",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"mjob run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    logged = steps(workdir / "logs")
    killed_at = next(t for t, i in logged if i == STEP)
    # The first step whose iteration went backwards is the resumed attempt's first step.
    resumed = next(t for k, (t, i) in enumerate(logged) if k and i < logged[k - 1][1])
    return resumed - killed_at


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"machine: {platform.node()}, python {platform.python_version()}; kill rank 1 at step "
        f"{STEP}"
    )
    results: dict[str, list[float]] = {"InPlace": [], "Recreate": []}
    for i in range(args.repeat):
        for strategy in ("InPlace", "Recreate") if i % 2 == 0 else ("Recreate", "InPlace"):
            with tempfile.TemporaryDirectory(prefix="mjob-recovery-") as d:
                t = one_run(Path(d), strategy)
            results[strategy].append(t)
            print(f"{strategy} run {len(results[strategy])}: kill → first resumed step {t:.1f} s")
    for strategy, values in results.items():
        print(
            f"{strategy}: kill → first resumed step median {statistics.median(values):.1f} s, "
            f"best {min(values):.1f} s, worst {max(values):.1f} s (goal ≤ 20 s)"
        )
    ratio = statistics.median(results["Recreate"]) / statistics.median(results["InPlace"])
    print(f"ratio Recreate/InPlace = {ratio:.1f}×")


if __name__ == "__main__":
    main()
