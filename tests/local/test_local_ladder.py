"""The restart ladder in `mjob run --local`, where processes stand in for pods: a killed rank
restarts in place inside its launcher process, a killed launcher process ("pod") is replaced
alone, a lost "pod" with a spare beside it (resources.spareNodes) hands its node rank to the
spare (node rank 0's too, with the coordinator), and all resume exactly (losses bit-identical to
an uninterrupted run). The spare scenarios take about 30 s each on 2 cores.

The checkpoint tiers (with test_local_run's and test_object_storage's kills, 20 kill points in
these runs): each in-place restart resumes from every pod's own memory (or the other pod's copy,
where the kill landed in the write of a snapshot already exchanged) and each replaced pod's
ranks from the copy in the other pod's, at most one step behind the last step the trainer
reported; a recreate resumes from the durable checkpoint. At most 7 restarts a run (past 5 an
hour, the operator's floor before a recreate doubles: core/churn.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from megatron_operator.local.runner import POLL_SECONDS
from megatron_trainer.agent.wire import MAX_PENDING
from tests.goodput_truth import check_ledger

from .test_local_run import ROOT, check_tiers, run_argv

pytestmark = pytest.mark.trainer

# Two "pods" of one rank each (data parallel 2), so there is a pod to replace.
TWO_PODS = ["--set", "resources.nodes=2", "--set", "resources.procsPerNode=1"]
TWO_PODS += ["--set", "parallelism.tensor=1", "--set", "checkpoint.keep=0"]
# Two nodes share the checkpoint volume (the example asks for ReadWriteOnce: one node).
TWO_PODS += ["--set", 'checkpoint.volume.create.accessModes=["ReadWriteMany"]']
# Room for the seeded kills, without the backoff growing between them.
TWO_PODS += ["--set", "restartPolicy.maxRestarts=30", "--set", "restartPolicy.maxBackoffSeconds=1"]
ITERS = 24
SEED = 40  # the kill points: random.Random(SEED)
IN_PLACE_KILLS = 6  # in test_a_killed_rank_restarts_in_place
# In test_a_killed_launcher_process_is_replaced_alone: the test's own kill of a launcher, then
# these, then the pod of node rank 0 (a recreate).
POD_KILLS, RANK_KILLS = 3, 2
# restartPolicy.hangTimeoutSeconds in test_a_killed_rank_restarts_in_place: between records only
# (a new gang is held to firstStepTimeoutSeconds until its first step, an in-place attempt to
# inPlaceTimeoutSeconds; under CI load the first attempt's first step took up to 30 s), well
# above a step's time under that load, so that only the injected hang trips it.
HANG_TIMEOUT = 30


def run(workdir: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = run_argv(workdir, *TWO_PODS, *extra, iters=ITERS, save=3)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False, cwd=ROOT)
    path = workdir / "summary.json"
    return proc.returncode, json.loads(path.read_text()) if path.exists() else {}, proc.stdout


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    code, summary, out = run(tmp_path_factory.mktemp("clean"))
    assert code == 0, out
    return summary


def test_a_killed_rank_restarts_in_place(clean: dict[str, Any], tmp_path: Path) -> None:
    steps = sorted(random.Random(SEED).sample(range(2, ITERS), IN_PLACE_KILLS))
    kills = [f"{step}:{i % 2}" for i, step in enumerate(steps)]
    # And a hang: rank 1 stopped (SIGSTOP) after a step between two kills, so rank 0 waits in
    # the next step's collective and no record comes; the hang rule restarts the gang in place.
    hang = next(step for step in range(steps[2] + 1, ITERS) if step not in steps)
    failures = [*kills, f"{hang}:1:STOP"]
    code, s, out = run(
        tmp_path,
        *(a for k in failures for a in ("--inject-failure", k)),
        "--set",
        f"restartPolicy.hangTimeoutSeconds={HANG_TIMEOUT}",
    )
    assert code == 0, out[-3000:]
    events = [line for line in out.splitlines() if line.startswith(("[attempt", "  cpu-tiny"))]
    assert s["restarts"] == len(failures), "\n".join(events[-60:])
    assert s["losses"] == clean["losses"]
    assert f"SIGSTOP to rank 1 at step {hang}" in out
    # From memory every time: the pod's own, or, where the kill landed in a snapshot's write
    # after its copies were exchanged, the copy in the other pod (the same step).
    check_tiers(tmp_path, [("Memory", "Peer")] * len(failures))
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["lastFailure"]["rung"] == "InPlace", status["lastFailure"]
    assert status["gangAttempt"] == 0 and status["restartAttempt"] == len(failures)
    # The goodput ledger against the true timeline (the trainer's step records and the
    # injector's log): the kills' recomputed work, and the hang's wait from the gang's last
    # record to the Hang restart's kill of the stopped rank (tests/goodput_truth.py).
    figures = check_ledger(tmp_path)
    # The hang rule counts from the heartbeat, the record's time in whole seconds: up to 1 s
    # before the record itself.
    assert HANG_TIMEOUT - 1 <= figures["hangDetection"] <= HANG_TIMEOUT + 3, figures
    # No process group was replaced: every "pod" log is attempt 0's, and it goes on.
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["attempt-0"]
    pod1 = (tmp_path / "logs" / "attempt-0" / "cpu-tiny-a0-1.log").read_text()
    assert "started the ranks of attempt 1" in pod1


def test_a_killed_launcher_process_is_replaced_alone(clean: dict[str, Any], tmp_path: Path) -> None:
    # After the test's own kill (about step 5): seeded pod and rank kills, then node rank 0's pod.
    rng = random.Random(SEED + 1)
    steps = sorted(rng.sample(range(9, ITERS - 2), POD_KILLS + RANK_KILLS))
    kinds = rng.sample(["pod1"] * POD_KILLS + ["1"] * RANK_KILLS, POD_KILLS + RANK_KILLS)
    kills = [f"{step}:{kind}" for step, kind in zip(steps, kinds, strict=True)] + [
        f"{ITERS - 1}:pod0"
    ]
    proc = subprocess.Popen(
        run_argv(
            tmp_path,
            *TWO_PODS,
            *(a for k in kills for a in ("--inject-failure", k)),
            iters=ITERS,
            save=3,
        ),
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
    launchers = {
        p.environ().get("NODE_RANK"): p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if p.cmdline()[-2:] == ["-m", "megatron_trainer"]
    }
    assert set(launchers) == {"0", "1"}
    # Another local user's process: it cannot read the run's key, poses as node rank 1 and
    # reports exit code 78 (which fails a job), and holds idle connections, twice the cap, for
    # the rest of the run. None of it counts: the replacement of node rank 1 still joins.
    key = tmp_path / "coordinator.key"
    assert key.stat().st_mode & 0o777 == 0o600
    port = int(launchers["0"].environ()["MEGATRON_COORDINATOR_PORT"])
    idle = [
        socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2 * MAX_PENDING)
    ]
    forged = _forge(port, node=1)
    os.kill(launchers["1"].pid, signal.SIGKILL)  # the "container" of node rank 1
    killed = time.time()
    out, _ = proc.communicate(timeout=1200)
    for sock in [*idle, forged]:
        sock.close()
    assert proc.returncode == 0, out[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["restarts"] == 1 + len(kills) and s["losses"] == clean["losses"]
    # A replaced pod's rank restores from the copy in the other pod's memory, a restarted rank
    # from its own, and after node rank 0's pod (a recreate) every rank from the durable tier.
    tier: dict[str, str | tuple[str, ...]] = {
        "pod1": "Peer",
        "1": ("Memory", "Peer"),  # Peer: the kill landed in the write of an exchanged snapshot
        "pod0": "Durable",
    }
    check_tiers(tmp_path, ["Peer", *(tier[k.split(":")[1]] for k in kills)])
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["lastFailure"]["rung"] == "Recreate", status["lastFailure"]
    logs = tmp_path / "logs"
    assert sorted(p.name for p in (logs / "attempt-0").iterdir()) == [
        "cpu-tiny-a0-0.log",
        "cpu-tiny-a0-1.log",
    ]
    assert sorted(p.name for p in (logs / "attempt-1").iterdir()) == ["cpu-tiny-a1-1.log"]
    assert (
        "started the ranks of attempt 1" in (logs / "attempt-0" / "cpu-tiny-a0-0.log").read_text()
    )
    # The goodput ledger against the true timeline (a lost pod: its rank died with it).
    died = [i["diedAt"] or i["at"] for i in s["injections"]]
    check_ledger(tmp_path, kills=sorted([killed, *died]))
    assert s["ledger"]["seconds"]["restartReplacePod"] > 0


def _forge(port: int, node: int) -> socket.socket:
    """A hello as `node` under a guessed key, then a failure with exit code 78."""
    from megatron_trainer.agent.wire import encode, hello_mac

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    challenge = json.loads(sock.makefile("rb").readline())["nonce"]
    hello = {"op": "hello", "node": node, "pod": "x", "epoch": 0, "nonce": "ab" * 32}
    hello["mac"] = hello_mac(b"guessed-key-guessed-key", challenge, hello)
    failed = {"op": "failed", "epoch": 0, "local": 0, "code": 78, "time": "2026-01-01T00:00:00Z"}
    sock.sendall(encode(hello) + encode(failed))
    return sock


# --- spare nodes: a lost "pod" (its whole process group killed, as a lost node takes its
# launcher and ranks with it) hands its node rank to the warm spare; no pod is made on the way.
SPARE = ["--set", "resources.spareNodes=1"]


def _launchers(proc: subprocess.Popen[str]) -> dict[str, psutil.Process]:
    """The launcher process of each "pod", by NODE_RANK (the spare's is 2)."""
    return {
        p.environ().get("NODE_RANK", "?"): p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if p.cmdline()[-2:] == ["-m", "megatron_trainer"]
    }


# The runner times a "pod"'s (a launcher process's) death as the kubelet's finishedAt, by a
# thread blocked in waitpid, and the ledger's failure time is that: it may differ from the kill's
# time by that thread's and the test's own wake-ups on a loaded machine (no longer by a poll and
# a reconcile, which once made it 0.52 s against a true 0.29 s in CI).
SEEN_WITHIN = 2 * POLL_SECONDS


def _lose_a_pod(tmp_path: Path, node: str) -> tuple[int, dict[str, Any], str, float]:
    proc = subprocess.Popen(
        run_argv(tmp_path, *TWO_PODS, *SPARE, iters=ITERS, save=3),
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
    clean: dict[str, Any],
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
    check_ledger(tmp_path, kills=[killed], spread=SEEN_WITHIN)
    assert s["ledger"]["seconds"]["restartSpareSwap"] > 0


def test_node_rank_0_lost_moves_the_coordinator_and_its_rank(
    clean: dict[str, Any],
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
    check_ledger(tmp_path, kills=[killed], spread=SEEN_WITHIN)
