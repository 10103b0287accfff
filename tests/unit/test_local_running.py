"""A local "pod" (a process group) as the state machine sees it: its end timed when it happened,
as the kubelet's finishedAt, not when the runner next looked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from megatron_operator.local.runner import Running


def _pod(tmp_path: Path, code: str) -> Running:
    log = (tmp_path / "pod.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, start_new_session=True)
    return Running("job-a0-0", 0, 0, proc, log)


def test_a_killed_pod_is_failed_with_the_time_it_died_not_when_it_was_seen(
    tmp_path: Path,
) -> None:
    pod = _pod(tmp_path, "import time; time.sleep(60)")
    try:
        running = pod.view("uid")
        assert running.phase == "Running" and running.finished_at is None
        os.killpg(pod.proc.pid, signal.SIGKILL)
        killed = datetime.now(UTC)
        time.sleep(2.0)  # a runner late by two seconds, as on a loaded machine
        seen = pod.view("uid")
    finally:
        pod.log.close()
    assert seen.phase == "Failed" and seen.exit_code is None  # a signal, not an exit code
    assert seen.finished_at is not None
    # timed by the reaping thread's wake-up, not by the look two seconds later
    assert abs((seen.finished_at - killed).total_seconds()) < 1.0, (seen.finished_at, killed)
    # poll() still works beside the reaping thread: the code is the signal's
    assert pod.proc.poll() == -signal.SIGKILL


def test_a_pod_that_exits_is_succeeded_with_its_end(tmp_path: Path) -> None:
    pod = _pod(tmp_path, "pass")
    try:
        pod.proc.wait()
        deadline = time.monotonic() + 10
        while pod.view(None).phase == "Running" and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = pod.view(None)
    finally:
        pod.log.close()
    assert seen.phase == "Succeeded" and seen.exit_code == 0 and seen.finished_at is not None
