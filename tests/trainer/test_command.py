"""The launcher with a spec.trainer.command: each rank runs the command with its own env, $(VAR)
expanded per rank; a failing rank stops the others and sets the pod's exit code; SIGTERM reaches
every rank; a missing executable is a config error (78); and the ITERATION LOSS lines rank 0
appends to MEGATRON_PROGRESS_LOG come out as the job's progress records."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.exitcodes import ExitCode
from megatron_contract.ports import free_port
from megatron_trainer.forward import Forwarder, Steps
from megatron_trainer.progress import ProgressReporter

from .trainer_configs import tiny_config, write_config
from .trainer_runs import pod_env

pytestmark = pytest.mark.trainer

# A rank in any language would do; this one is Python for brevity. It prints its argv and env,
# appends progress, and then does what `mode` says.
RANK_SCRIPT = """
import os, sys, time
rank = int(os.environ["RANK"])
# One write per line: the launcher runs ranks unbuffered (PYTHONUNBUFFERED), where print() writes
# each argument apart, and the two ranks share the pod's stdout.
sys.stdout.write(f"rank {rank} argv {sys.argv[1:]} local {os.environ['LOCAL_RANK']} "
                 f"world {os.environ['WORLD_SIZE']}\\n")
mode = sys.argv[1]
if rank == 0:
    with open(os.environ["MEGATRON_PROGRESS_LOG"], "a") as f:
        for step in range(1, 4):
            f.write(f"{step} {1.0 / step}\\n")
        f.write("not a progress line\\n")
        f.write("4 loss=0.2 checkpoint=4\\n")
if mode == "fail" and rank == 1:
    sys.exit(3)
if mode == "sleep" or mode == "fail":
    import signal
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    time.sleep(60)
"""


def command_config(tmp: Path, mode: str) -> dict[str, Any]:
    cfg = tiny_config(tmp / "ckpt", dp=2)
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    for section in ("model", "training", "data"):
        cfg[section] = None
    cfg["trainer"] = {
        "command": [sys.executable, str(script)],
        "args": [mode, "r=$(RANK)", "$(MEGATRON_NOPE)", "$$(RANK)", "$(LOCAL_RANK)"],
        "progress": "MegatronLog",
    }
    return cfg


def launch(cfg: dict[str, Any], tmp: Path, sigterm: bool = False) -> tuple[int, str]:
    """Run the launcher; with `sigterm`, send it SIGTERM once both ranks have started."""
    path = write_config(cfg, tmp / "config.json")
    env = {**pod_env(cfg, path, free_port()), "MEGATRON_PROGRESS_FILE": str(tmp / "progress.jsonl")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "megatron_trainer"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    if sigterm:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while sum("argv" in line for line in seen) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, "".join(seen) + out


def test_each_rank_runs_the_command_with_its_own_expansion(tmp_path: Path) -> None:
    code, out = launch(command_config(tmp_path, "ok"), tmp_path)
    assert code == 0, out
    for rank in (0, 1):
        argv = ["ok", f"r={rank}", "$(MEGATRON_NOPE)", "$(RANK)", str(rank)]
        assert f"rank {rank} argv {argv} local {rank} world 2" in out, out
    records = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["loss"]) for r in records] == [
        (1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3)), (4, 0.2)
    ]  # fmt: skip
    assert records[-1]["checkpointIteration"] == 4 and records[0]["attempt"] == 0
    assert "MEGATRON_PROGRESS " in out  # the stdout line, as the built-in trainer prints


def test_a_failing_rank_stops_the_others_with_its_code(tmp_path: Path) -> None:
    started = time.monotonic()
    code, out = launch(command_config(tmp_path, "fail"), tmp_path)
    assert code == 3, out
    assert time.monotonic() - started < 30  # rank 0 was killed, not waited for
    assert "local rank 1 exited with 3" in out


def test_sigterm_reaches_every_rank(tmp_path: Path) -> None:
    code, out = launch(command_config(tmp_path, "sleep"), tmp_path, sigterm=True)
    assert code == ExitCode.SIGTERM, out


def test_a_missing_executable_is_a_config_error(tmp_path: Path) -> None:
    cfg = command_config(tmp_path, "ok")
    cfg["trainer"]["command"] = ["no-such-trainer-binary"]
    code, out = launch(cfg, tmp_path)
    assert code == ExitCode.CONFIG, out
    assert "trainer.command: 'no-such-trainer-binary' is not an executable" in out
    assert "Traceback" not in out


def test_the_forwarder_reads_partial_and_huge_lines(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    out = tmp_path / "out.jsonl"
    reporter = ProgressReporter(True, str(out), None, 10.0, 1)
    fwd = Forwarder(str(log), Steps(reporter), poll=3600)
    fwd.read()  # no file yet: nothing, no error
    log.write_bytes(b"1 1.5\n2 1.")
    fwd.read()
    log.write_bytes(b"1 1.5\n2 1.25\n" + b"9" * 10_000 + b"\n1 0.1\n3 1.0\n")
    fwd.read()
    fwd.close()
    got = [json.loads(x) for x in out.read_text().splitlines()]
    # Step 2 once and whole, the huge line skipped, the step going back (1) ignored.
    assert [(r["iteration"], r["loss"], r["attempt"]) for r in got] == [
        (1, 1.5, 1), (2, 1.25, 1), (3, 1.0, 1)
    ]  # fmt: skip


STOP_WHILE_STARTING = """
import os, signal, sys
from megatron_trainer.launcher import Supervisor
from megatron_contract.env import runtime_env

env = runtime_env({
    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "WORLD_SIZE": "2", "NNODES": "1",
    "NODE_RANK": "0", "NPROC_PER_NODE": "2", "MEGATRON_CONFIG": "/unused",
    "MEGATRON_RESTART_ATTEMPT": "0",
})
out = sys.argv[1]
rank = [sys.executable, "-c",
        "import os, signal, sys, time\\n"
        "def stop(s, f):\\n"
        f"    open(os.path.join({out!r}, 'stopped-' + os.environ['RANK']), 'w').close()\\n"
        "    sys.exit(143)\\n"
        "signal.signal(signal.SIGTERM, stop)\\n"
        f"open(os.path.join({out!r}, 'up-' + os.environ['RANK']), 'w').close()\\n"
        "time.sleep(60)\\n"]

def wrap(global_rank, argv):
    if global_rank == 1:  # the stop comes after rank 0 started, before rank 1 does
        os.kill(os.getpid(), signal.SIGTERM)
    return argv

supervisor = Supervisor(env, True, rank, wrap=wrap)
supervisor.start()
sys.exit(supervisor.wait())
"""


def test_a_stop_while_the_ranks_start_reaches_every_rank(tmp_path: Path) -> None:
    """SIGTERM to the launcher between its ranks' starts: the launcher is not ended by it (its
    handler is in place before the first rank), and it stops the ranks on both sides of it: it
    exits 143 well before the ranks' 60 s sleep ends (a rank may take it before its own handler
    is set, so the rank's file is not required)."""
    proc = subprocess.run(
        [sys.executable, "-c", STOP_WHILE_STARTING, str(tmp_path)],
        capture_output=True, text=True, timeout=50, check=False,
    )  # fmt: skip
    assert proc.returncode == ExitCode.SIGTERM, (proc.returncode, proc.stderr[-2000:])
