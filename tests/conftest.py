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
    """The tests that need the session's cluster with real nodes run on one xdist worker
    (`-n 3 --dist loadgroup`): that cluster is started once per worker that uses it, and two
    of them on one machine would collide (node names, namespaces, ~10 GB of images each).
    Other session state (the kwok control plane, the trainer's reference runs) is cheap enough
    to make once per worker, and spreading those tests keeps both cores busy."""
    path = Path(str(item.path)).resolve()
    if TESTS not in path.parents:
        return None
    if "real_cluster" in getattr(item, "fixturenames", ()):
        return "real-nodes"
    return None


# Before xdist's own hook, which reads the marks to put the group into each node id: a mark
# added after it is never seen, and every worker then starts a real cluster of its own.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
