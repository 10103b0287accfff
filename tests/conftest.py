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
    """Which tests share an xdist worker (`-n 3 --dist loadgroup`); None: any worker.

    - The tests that need the session's cluster with real nodes: that cluster is started once
      per worker that uses it, and two of them on one machine would collide (node names,
      namespaces, ~10 GB of images each).
    - The tests that read the trainer's reference runs (a 10-step run per layout, cached for the
      session): spread over three workers, the same runs were made on each (tp1 up to three
      times).
    - A module's own `pytest.mark.xdist_group`.
    - The tests of a module with a module-scoped fixture of ours (a training run, an S3 server
      and two jobs, an operator): such a fixture is made once per worker that runs one of its
      tests, so spread over three workers it was made up to three times (a CI run spent
      2 x 280 s making one twice).
    Other session state (the kwok control plane) is cheap enough to make once per worker, and
    spreading the other tests keeps both cores busy."""
    path = Path(str(item.path)).resolve()
    if TESTS not in path.parents:
        return None
    fixtures = getattr(item, "fixturenames", ())
    if "real_cluster" in fixtures:
        return "real-nodes"
    if "reference_runs" in fixtures:
        return "reference-runs"
    names = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
    if names:
        return "_".join(names)
    if _uses_module_fixture(item):
        return f"module:{path.relative_to(TESTS.parent).as_posix()}"
    return None


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(info, "name2fixturedefs", {}).values():
        for d in defs:
            ours = getattr(d.func, "__module__", "").startswith("tests.")
            if ours and d.scope in ("module", "package", "class"):
                return True
    return False


def _join_group(item: pytest.Item, group: str) -> None:
    """Put the item in an xdist `loadgroup` group: xdist reads the group from the node id's
    `@group` suffix. xdist 3.8 writes that suffix into `item._nodeid`, which pytest 9.2 no
    longer reads (the id lives in `item._id`): its own mark would be silently ignored, and
    every worker would start a real cluster of its own. So the suffix is written here, the way
    the running pytest keeps it, no mark is added here."""
    tagged = f"{item.nodeid}@{group}"
    if isinstance(getattr(item, "_id", None), str) or not hasattr(item, "_id"):
        item._nodeid = tagged  # type: ignore[attr-defined]  # pytest < 9.2
        return
    from _pytest.nodeid import NodeId  # pytest >= 9.2

    item._id = NodeId.parse(tagged)  # type: ignore[attr-defined]


# Before xdist's own hook, so that the ids the workers report carry the group.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # On a worker xdist has set `dist` to "no" and kept the choice in `loadgroup`.
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        group = xdist_group(item)
        if group is not None:
            _join_group(item, group)
