"""How fast `mjob validate` refuses each adversarial spec (the table in tests/unit/adversarial.py).

Goal (issue 15): every case answers with exit 2 within 2 s. Prints, over all cases, the slowest
and the median time of `main(["validate", FILE])` in this process (the best of `--repeat` runs of
each case), then the wall time of the installed entry point, a fresh Python process, for the
worst YAML cases (deep nesting, an alias bomb, duplicate keys, NaN), which includes the
interpreter's start and the imports. Run: python benchmarks/adversarial_specs.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from megatron_operator.cli.main import main  # noqa: E402
from tests.unit.adversarial import CASES, WORST_YAML, validate_in_new_process  # noqa: E402

GOAL_SECONDS = 2.0


def _in_process(path: Path) -> tuple[int, float]:
    sink = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        code = main(["validate", str(path)])
    return code, time.perf_counter() - start


def _process(path: Path) -> tuple[int, float]:
    start = time.perf_counter()
    code = validate_in_new_process(path).returncode
    return code, time.perf_counter() - start


def run(repeat: int) -> int:
    print(
        f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, load "
        f"{os.getloadavg()[0]:.1f}"
    )
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        times: dict[str, float] = {}
        for case in CASES:
            path = Path(tmp) / "job.yaml"
            path.write_text(case.text, encoding="utf-8")
            best = float("inf")
            for _ in range(repeat):
                code, seconds = _in_process(path)
                if code != 2:
                    print(f"  {case.id}: exit {code}, expected 2")
                    bad += 1
                best = min(best, seconds)
            times[case.id] = best
        slowest = sorted(times.items(), key=lambda kv: -kv[1])[:3]
        print(
            f"{len(CASES)} cases in process: median {statistics.median(times.values()):.3f} s, "
            f"slowest " + ", ".join(f"{k!r} {v:.3f} s" for k, v in slowest)
        )
        for case in (c for c in CASES if c.id in WORST_YAML):
            path = Path(tmp) / "job.yaml"
            path.write_text(case.text, encoding="utf-8")
            code, seconds = _process(path)
            if code != 2:
                bad += 1
            print(f"  new process, {case.id!r}: exit {code} in {seconds:.2f} s")
        worst = max(times.values())
        print(
            f"goal: every case within {GOAL_SECONDS} s in process: "
            f"{'met' if worst <= GOAL_SECONDS else 'missed'} (slowest {worst:.3f} s)"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case (best is kept)")
    sys.exit(run(parser.parse_args().repeat))
