"""The whole suite: the run fails if a process it started outlives it (tests/process_check.py).

An orphaned rank helper once kept 5.8 GB of memory after a CI run; the check at the end of every
session makes such a leak a failure that names the processes, instead of a slow machine later.
"""

from tests.process_check import (  # noqa: F401 (pytest hooks, found by name)
    pytest_configure,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
