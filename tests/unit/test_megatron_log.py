"""Progress from Megatron-LM's own log lines (megatron_contract.megatron_log), read from the
ranks' output on its way to the pod's log (agent/output.py, forward.LogProgress): the formats of
Megatron-LM core_v0.16.1's training_log and checkpointing, and tenant-written garbage."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_contract.megatron_log import LogStep, parse_line
from megatron_trainer.agent.output import RankOutput
from megatron_trainer.forward import LogProgress, Steps, save_dir_of
from megatron_trainer.progress import ProgressReporter

# megatron/training/training.py training_log, and checkpointing.py's save and load lines.
ITERATION = (
    " [2026-11-02 10:00:00.123456] iteration      100/    1000 | consumed samples:         3200 "
    "| elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 101.2 | "
    "learning rate: 1.000000E-04 | global batch size:    32 | lm loss: 2.314000E+00 | "
    "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan "
    "iterations:   0 |"
)
SAVED = (
    "  [2026-11-02 10:00:05.000000] successfully saved checkpoint from iteration     100 to "
    "/mnt/checkpoints/gpt [ t 1/2, p 1/2 ]"
)
LOADED = (
    "  successfully loaded checkpoint from /mnt/checkpoints/gpt [ t 1/2, p 1/2 ] at iteration 100"
)


def test_megatron_lms_lines_give_step_loss_and_checkpoints() -> None:
    assert parse_line(ITERATION) == LogStep(iteration=100, loss=2.314)
    assert parse_line(SAVED) == LogStep(saved=100)
    assert parse_line(LOADED) == LogStep(loaded=100)
    # Another model's loss name (no `lm loss`) is read; a nan loss is a step without one.
    assert parse_line("iteration 5/ 10 | mtp_1 loss: 1.5E+00 |") == LogStep(iteration=5, loss=1.5)
    assert parse_line("iteration 6/ 10 | lm loss: nan |") == LogStep(iteration=6)
    for noise in ("", "iteration", "iteration 7 of 10", "x" * 100_000, "iteration 9" * 10_000):
        assert parse_line(noise) is None
    assert parse_line("iteration 99999999999999/ 1 |") is None  # beyond any job's iterations


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_text_parses_or_is_skipped_without_raising(text: str) -> None:
    parse_line(text)
    parse_line(ITERATION[:50] + text)


def test_the_output_is_copied_whole_and_read_line_by_line(tmp_path: Path) -> None:
    """A real rank process: its stdout and stderr reach the launcher's own, byte for byte (a
    1 MiB line and one without a newline at the end included), and the last rank's iteration
    lines and rank 0's checkpoint line become the progress records."""
    script = (
        "import sys\n"
        f"print({ITERATION!r}, flush=True)\n"
        "sys.stdout.write('Q' * (1 << 20) + '\\n')\n"
        f"print({ITERATION.replace('100/', '101/').replace('2.314', '2.2')!r}, file=sys.stderr)\n"
        f"print({SAVED.replace('100', '101')!r})\n"
        "sys.stdout.write('no newline at the end')\n"
    )
    out_r, out_w = os.pipe()
    err_path = tmp_path / "stderr"
    err = os.open(err_path, os.O_WRONLY | os.O_CREAT)
    progress = tmp_path / "progress.jsonl"
    steps = Steps(ProgressReporter(True, str(progress), None, 10.0, 0))
    reader = LogProgress(steps, reporting=0)
    output = RankOutput(reader.line, out_fd=out_w, err_fd=err)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    output.attach(0, proc)
    copied = b""
    os.set_blocking(out_r, False)
    while proc.poll() is None or any(t.is_alive() for t in output.threads):
        with contextlib.suppress(BlockingIOError):
            copied += os.read(out_r, 1 << 20)
    output.join()
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(out_r, 1 << 20):
            copied += chunk
    assert copied.count(b"Q") == 1 << 20 and copied.endswith(b"no newline at the end")
    assert b"iteration      101/" in err_path.read_bytes()
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [(r["iteration"], r["loss"]) for r in records] == [(100, 2.314), (101, 2.2)]
    # Lines of another local rank give no step: only the last rank's do.
    other = LogProgress(steps, reporting=1)
    other.line(0, ITERATION.replace("100/", "200/"))
    assert steps.last == 101


def test_the_save_directory_and_its_tracker(tmp_path: Path) -> None:
    assert save_dir_of(["python", "pretrain_gpt.py", "--save", "/c", "--load", "/c"]) == "/c"
    assert save_dir_of(["x", "--save=/d"]) == "/d" and save_dir_of(["x", "--save"]) is None
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("40")
    out = tmp_path / "p.jsonl"
    steps = Steps(ProgressReporter(True, str(out), None, 10.0, 3))
    LogProgress(steps, 0, str(tmp_path)).line(0, ITERATION)
    record = json.loads(out.read_text())
    assert (record["iteration"], record["checkpointIteration"], record["attempt"]) == (100, 40, 3)
    steps.restart(4)  # an in-place restart: the steps of attempt 4 start over
    LogProgress(steps, 0).line(0, ITERATION.replace("100/", "60/"))
    last = json.loads(out.read_text().splitlines()[-1])
    assert (last["iteration"], last["attempt"]) == (60, 4)
