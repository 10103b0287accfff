"""`python -m megatron_trainer` refuses a bad job before any rank starts: exit 78 (EX_CONFIG, the
operator's "Fail at once") and a message naming the field, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.exitcodes import ExitCode
from megatron_contract.ports import free_port
from megatron_trainer.launcher import exit_code

from .trainer_configs import tiny_config, write_config
from .trainer_runs import pod_env

pytestmark = pytest.mark.trainer


def launch(cfg: dict[str, Any], workdir: Path, **env: str) -> tuple[int, str, float]:
    path = write_config(cfg, workdir / "config.json")
    environ = {**pod_env(cfg, path, free_port()), **env}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_trainer"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def bad_recipe(cfg: dict[str, Any], tmp: Path) -> None:
    cfg["model"]["recipe"] = "gpt-enormous"


def bad_layout(cfg: dict[str, Any], tmp: Path) -> None:
    cfg["parallelism"]["tensor"] = 3  # 4 heads are not divisible by 3; 2 ranks neither


def missing_data(cfg: dict[str, Any], tmp: Path) -> None:
    cfg["data"].update(
        mock=False,
        blend=[{"weight": 1.0, "prefix": str(tmp / "nowhere" / "corpus")}],
        tokenizer={"path": str(tmp)},
    )


def alltoall_on_cpu(cfg: dict[str, Any], tmp: Path) -> None:
    cfg["model"]["moe"] = {
        "numExperts": 4, "routerTopK": 2, "ffnHiddenSize": 176, "sharedExpertFfnHiddenSize": None,
        "firstKDenseLayers": 0, "auxLossCoeff": 0.0, "tokenDispatcher": "alltoall", "routerPreSoftmax": False,
    }  # fmt: skip
    cfg["parallelism"].update(expert=2, expertData=1)


def _on_gpu(cfg: dict[str, Any], **parallelism: Any) -> None:
    cfg["resources"]["accelerator"] = "nvidia.com/gpu"
    cfg["training"]["precision"] = "bf16"
    cfg["parallelism"].update(data=1, expertData=1, **parallelism)


def sp_by_default_without_te(cfg: dict[str, Any], tmp: Path) -> None:
    # As the operator renders TP2 on GPUs with sequenceParallel unset (on by default).
    _on_gpu(cfg, tensor=2, expertTensor=2, sequenceParallel=True)


def cp_without_te(cfg: dict[str, Any], tmp: Path) -> None:
    _on_gpu(cfg, context=2)


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        (bad_recipe, "model.recipe: unknown recipe 'gpt-enormous'"),
        # This machine has no Transformer Engine: the launcher refuses, not the rank.
        (
            sp_by_default_without_te,
            "Sequence parallelism is on by default with tensor > 1 on GPUs: set "
            "parallelism.sequenceParallel: false to run without it",
        ),
        (cp_without_te, "parallelism.context: context parallelism needs Transformer Engine"),
        (
            bad_layout,
            "parallelism.tensor: numAttentionHeads (4) is not divisible by parallelism.tensor (3)",
        ),
        (missing_data, "corpus.bin does not exist; run `mjob preprocess`"),
        (alltoall_on_cpu, "model.moe.tokenDispatcher: the alltoall dispatcher is CUDA-only"),
    ],
)
def test_bad_config_fails_fast(breakage: Any, expected: str, tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "ckpt", dp=2)
    breakage(cfg, tmp_path)
    code, output, seconds = launch(cfg, tmp_path)
    assert code == ExitCode.CONFIG, output
    assert expected in output
    assert "Traceback" not in output
    assert seconds < 30  # no rank was started: validation needs no torch import
    assert not (tmp_path / "ckpt").exists()


def test_unwritable_checkpoint_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cfg = tiny_config(blocker / "ckpt")
    code, output, _ = launch(cfg, tmp_path)
    assert code == ExitCode.CONFIG
    assert f"checkpoint.dir: cannot write to {blocker / 'ckpt'}" in output


def test_missing_env_is_a_config_error(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path / "ckpt")
    code, output, _ = launch(cfg, tmp_path, MASTER_ADDR="", NODE_RANK="3")
    assert code == ExitCode.CONFIG
    assert "MASTER_ADDR: required environment variable is not set" in output
    assert "NODE_RANK (3) must be < NNODES (1)" in output


def test_rank_exit_codes_follow_the_shell_convention() -> None:
    assert exit_code(-9) == 137 and exit_code(-15) == 143
    assert exit_code(0) == 0 and exit_code(78) == 78


def test_version_and_unexpected_arguments() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "megatron_trainer", "--version"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and out.stdout.startswith("megatron_trainer ")
    bad = subprocess.run(
        [sys.executable, "-m", "megatron_trainer", "--oops"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == ExitCode.CONFIG and "--version" in bad.stderr


def test_termination_message_only_where_the_kubelet_made_the_file(tmp_path: Path) -> None:
    from megatron_trainer.launcher import write_termination_message

    log = tmp_path / "termination-log"
    assert not write_termination_message("why", str(log))  # no file: not in a pod
    assert not log.exists()
    log.write_text("")
    assert write_termination_message("x" * 5000 + "the reason", str(log))
    text = log.read_text()
    assert text.endswith("the reason") and len(text) == 1024


# As its container's PID 1 (a new PID namespace), the launcher's first lines note a SIGTERM that
# comes before its handlers exist (early_signals.py); the kernel drops it otherwise, and the pod
# waits out its termination grace period. The control shows the drop.
PID1 = """
import os, signal, sys, time
if sys.argv[1] == "launcher":
    import megatron_trainer.__main__  # its first lines, then the launcher's imports
os.kill(1, signal.SIGTERM)  # to this process, PID 1 of its namespace
time.sleep(0.2)
from megatron_trainer import early_signals
got = []
early_signals.replay(lambda signum, frame: got.append(signum))
print(got)
"""


@pytest.mark.parametrize(("start", "noted"), [("launcher", "[15]"), ("control", "[]")])
def test_a_stop_before_the_handlers_is_not_dropped_as_pid_1(start: str, noted: str) -> None:
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", PID1, start],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == noted, proc.stdout + proc.stderr
