"""`mjob run --local` of examples/byo-torch-ddp.yaml: a plain torch.distributed script as the
job's spec.trainer.command, with the operator's restart rules and progress."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/byo-torch-ddp.yaml"  # relative: the script path in it is, as in the image


def test_two_pods_one_failure_one_in_place_restart_and_success(tmp_path: Path) -> None:
    steps = 24
    args = (
        f"[--steps={steps}, --save-interval=5, --checkpoint-dir=$(MEGATRON_CHECKPOINT_DIR), "
        "--attempt=$(MEGATRON_RESTART_ATTEMPT), --fail-at-step=12, --fail-rank=1]"
    )
    proc = subprocess.run(
        [
            sys.executable, "-m", "megatron_operator.cli.main", "run", EXAMPLE, "--local",
            "--workdir", str(tmp_path),
            "--set", "resources.nodes=2", "--set", "resources.procsPerNode=1",
            "--set", "checkpoint.volume.create.accessModes=[ReadWriteMany]",
            "--set", f"trainer.args={args}",
        ],
        capture_output=True, text=True, timeout=900, check=False, cwd=ROOT,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "Succeeded"
    assert summary["restarts"] == 1  # rank 1 failed once, on attempt 0 only
    # The script's progress lines reached the summary: one loss per step, none missing.
    assert [step for step, _ in summary["losses"]] == list(range(1, steps + 1))
    assert summary["iterations"] == steps and summary["finalLoss"] < summary["losses"][0][1]
    assert summary["checkpoints"] == [5, 10, 15, 20, 24]
    # Restarted in place (the default strategy): the same two pod processes ran both attempts,
    # so attempt 0's logs hold everything, and each launcher started attempt 1's rank itself.
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["attempt-0"]
    pod0 = (tmp_path / "logs" / "attempt-0" / "byo-torch-ddp-a0-0.log").read_text()
    pod1 = (tmp_path / "logs" / "attempt-0" / "byo-torch-ddp-a0-1.log").read_text()
    for log in (pod0, pod1):
        assert "started the ranks of attempt 1" in log, log
    # World size and ranks: one rank in each of the two pods, both seen by rank 0.
    assert "torch_ddp: world size 2, ranks [(0, 0," in pod0 and ", (1, 0," in pod0
    assert "rank 1 fails at step 12 (attempt 0)" in pod1
    assert "resumed from step 10 (attempt 1)" in pod0
