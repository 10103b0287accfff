"""The end-of-session process check (tests/process_check.py) fails a run that leaves a process
behind, names it and kills it; a run that cleans up passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.process_check import pytest_configure, pytest_sessionfinish, pytest_terminal_summary
"""

# A daemon as a careless helper makes one: a grandchild in a new session whose parent exits at
# once, so that without the subreaper it would be re-parented to PID 1.
ORPHAN = """
import subprocess, sys

def test_leaves_an_orphan():
    code = "import os, subprocess, sys; subprocess.Popen(['sleep', sys.argv[1]], start_new_session=True); os._exit(0)"
    subprocess.run([sys.executable, "-c", code, "{token}"], check=True)
"""

CLEAN = """
import subprocess

def test_waits_for_its_child():
    subprocess.run(["sleep", "0.1"], check=True)
"""


def run_inner(tmp_path: Path, test_code: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(test_code))
    env = dict(os.environ, PYTHONPATH=str(REPO), MEGATRON_LEFTOVER_GRACE_SECONDS="1")
    env.pop("MEGATRON_TEST_SESSION", None)  # the inner run is a session of its own
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def sleeping(token: str) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", token.encode()]:
                out.append(proc.name)
    return out


def test_a_process_left_behind_fails_the_run_and_is_killed(tmp_path: Path) -> None:
    token = f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"
    proc = run_inner(tmp_path, ORPHAN.replace("{token}", token))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 passed" in out  # the test itself passed: the check is what failed the run
    assert "processes left behind" in out and f"sleep {token}" in out, out
    assert sleeping(token) == []  # and it was killed


def test_a_run_that_cleans_up_passes(tmp_path: Path) -> None:
    proc = run_inner(tmp_path, CLEAN)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "processes left behind" not in out
