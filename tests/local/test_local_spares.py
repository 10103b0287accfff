"""Spare nodes in `mjob run --local`, where process groups stand in for pods: a lost "pod" (its
whole process group killed, as a lost node takes its launcher and ranks with it) hands its node
rank to the warm spare, every launcher restarts in place, no pod is made on the way, and the run
resumes exactly (losses bit-identical to the uninterrupted run of the same spec). Node rank 0
too: its pod hosts the coordinator and the rendezvous, both of which move.

Each test is one local run of 14 steps on two "pods" plus a spare, about 60-90 s on 2 cores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.goodput_truth import check_ledger

from .test_local_ladder import TWO_PODS, clean  # noqa: F401  (the module's fixture)
from .test_local_run import ROOT, run_argv

pytestmark = pytest.mark.trainer

SPARE = ["--set", "resources.spareNodes=1"]


def _launchers(proc: subprocess.Popen[str]) -> dict[str, psutil.Process]:
    """The launcher process of each "pod", by NODE_RANK (the spare's is 2)."""
    return {
        p.environ().get("NODE_RANK", "?"): p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if p.cmdline()[-2:] == ["-m", "megatron_trainer"]
    }


def _lose_a_pod(tmp_path: Path, node: str) -> tuple[int, dict[str, Any], str, float]:
    proc = subprocess.Popen(
        run_argv(tmp_path, *TWO_PODS, *SPARE, iters=14, save=3),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    progress = tmp_path / "progress.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        lines = progress.read_text().splitlines() if progress.exists() else []
        if len(lines) >= 5:
            break
        time.sleep(0.2)
    launchers = _launchers(proc)
    assert set(launchers) == {"0", "1", "2"}, launchers
    # The "node" is lost: its launcher and its ranks at once (its process group).
    os.killpg(launchers[node].pid, signal.SIGKILL)
    killed = time.time()
    out, _ = proc.communicate(timeout=1200)
    path = tmp_path / "summary.json"
    return proc.returncode, json.loads(path.read_text()) if path.exists() else {}, out, killed


def _no_pod_made_on_the_way(tmp_path: Path) -> None:
    """Attempt 1's pods: only the spare made again afterwards (a new spare), no node rank's."""
    logs = tmp_path / "logs"
    assert sorted(p.name for p in (logs / "attempt-0").iterdir()) == [
        "cpu-tiny-a0-0.log",
        "cpu-tiny-a0-1.log",
        "cpu-tiny-a0-s0.log",
    ]
    made = (
        sorted(p.name for p in (logs / "attempt-1").iterdir())
        if (logs / "attempt-1").exists()
        else []
    )
    assert made in ([], ["cpu-tiny-a1-s0.log"]), made


def test_a_lost_pod_moves_its_node_rank_onto_the_spare(
    clean: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    code, s, out, killed = _lose_a_pod(tmp_path, "1")
    assert code == 0, out[-3000:]
    assert s["restarts"] == 1 and s["losses"] == clean["losses"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["lastFailure"]["rung"] == "SpareSwap", status["lastFailure"]
    assert status["swaps"] == {"1": "cpu-tiny-a0-s0"}
    _no_pod_made_on_the_way(tmp_path)
    spare = (tmp_path / "logs" / "attempt-0" / "cpu-tiny-a0-s0.log").read_text()
    assert "started the ranks of attempt 1" in spare and "running node rank 1" in spare
    check_ledger(tmp_path, kills=[killed])
    assert s["ledger"]["seconds"]["restartSpareSwap"] > 0


def test_node_rank_0_lost_moves_the_coordinator_and_its_rank(
    clean: dict[str, Any],  # noqa: F811
    tmp_path: Path,
) -> None:
    code, s, out, killed = _lose_a_pod(tmp_path, "0")
    assert code == 0, out[-3000:]
    assert s["restarts"] == 1 and s["losses"] == clean["losses"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["lastFailure"]["rung"] == "SpareSwap", status["lastFailure"]
    assert status["swaps"] == {"0": "cpu-tiny-a0-s0"}
    assert status["coordinator"]["pod"] == "cpu-tiny-a0-1", status.get("coordinator")
    _no_pod_made_on_the_way(tmp_path)
    pod1 = (tmp_path / "logs" / "attempt-0" / "cpu-tiny-a0-1.log").read_text()
    assert "coordinating (term 1)" in pod1 and "started the ranks of attempt 1" in pod1
    check_ledger(tmp_path, kills=[killed])
