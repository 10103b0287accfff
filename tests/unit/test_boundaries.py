"""Import boundaries: the pure core imports neither kopf nor a Kubernetes client, and the trainer
never imports the operator. Checked by static analysis of the import graph (import-linter's
contracts in pyproject.toml) and, independently, by importing the core in a clean interpreter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = [
    "megatron_operator.api",
    "megatron_operator.layout",
    "megatron_operator.render",
    "megatron_operator.resolve",
    "megatron_operator.memory",
    "megatron_operator.trainer_config",
]


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is missing: install the dev extra")
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.lower() or " 0 broken" in proc.stdout


def test_core_loads_without_kopf_or_kubernetes() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in CORE)
        + "bad = [m for m in ('kopf', 'kubernetes', 'megatron_trainer', 'torch') if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""
