"""The whole suite: the run fails if a process it started outlives it (tests/process_check.py).

An orphaned rank helper once kept 5.8 GB of memory after a CI run; the check at the end of every
session makes such a leak a failure that names the processes, instead of a slow machine later.
"""

from pathlib import Path

import pytest

from tests.process_check import (  # noqa: F401 (pytest hooks, found by name)
    pytest_configure,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

TESTS = Path(__file__).resolve().parent


def xdist_group(item: pytest.Item) -> str | None:
    """The tests that share a session's expensive state, run by one xdist worker
    (`-n 3 --dist loadgroup`): the kwok cluster, the real cluster, the trainer's reference
    runs, the local runner's baseline. xdist hands the biggest groups out first, one worker
    each, so the three big ones start at once: the two cluster groups mostly wait on their
    clusters while the trainer group computes."""
    path = Path(str(item.path)).resolve()
    if TESTS not in path.parents:
        return None
    parts = path.relative_to(TESTS).parts
    if parts[0] == "integration":
        real = "real_cluster" in getattr(item, "fixturenames", ())
        return "real-nodes" if real else "clusters"
    if parts[0] in ("trainer", "local"):
        return parts[0]
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
