"""The README's test command (`pytest -n 3 --dist loadgroup`) runs every test that uses the real
cluster on one worker,.

A CI run once started three real clusters at once (one per worker) because the group never
reached xdist's scheduler; the imports of the trainer image then failed on all three. This runs
the real suite's own modules under xdist, with the real-node tests skipped, and reads where each
test ran."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MODULES = [
    "tests/integration/test_real_nodes.py",
    "tests/integration/test_e2e.py",
    "tests/unit/test_alert_rules.py",
]
LINE = re.compile(r"^\[(gw\d+)\] .*?(SKIPPED|PASSED|FAILED|ERROR) (\S+)")


def test_each_group_runs_on_one_worker(tmp_path: Path) -> None:
    env = dict(os.environ, MEGATRON_REAL_NODES="0")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"),
         *MODULES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    workers: dict[str, set[str]] = defaultdict(set)
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if m:
            node_id = m.group(3)
            group = node_id.rsplit("@", 1)[1] if "@" in node_id else "(none)"
            workers[group].add(m.group(1))
    assert workers.get("real-nodes"), out.stdout[-3000:] + out.stderr[-3000:]
    assert len(workers["real-nodes"]) == 1, dict(workers)
    assert "(none)" not in workers, f"tests outside any group: {dict(workers)}"
    # A module with a module-scoped fixture of ours is one group: the fixture is made once.
    module = "module:tests/unit/test_alert_rules.py"
    assert len(workers.get(module, ())) == 1, dict(workers)


class _Item:
    """What `xdist_group` reads of a collected test."""

    def __init__(self, path: Path, fixtures: tuple[str, ...]) -> None:
        self.path = path
        self.fixturenames = fixtures

    def iter_markers(self, name: str) -> list[object]:
        return []


def test_the_reference_runs_are_one_group() -> None:
    from tests.conftest import xdist_group

    layouts = REPO / "tests" / "trainer" / "test_layouts.py"
    resume = REPO / "tests" / "trainer" / "test_resume.py"
    assert xdist_group(_Item(layouts, ("reference_runs",))) == "reference-runs"  # type: ignore[arg-type]
    assert xdist_group(_Item(resume, ("workdir", "reference_runs"))) == "reference-runs"  # type: ignore[arg-type]
    assert xdist_group(_Item(resume, ("workdir",))) is None  # type: ignore[arg-type]
