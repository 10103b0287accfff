"""Helpers for the chart tests: find helm, render the chart, pick objects out of the render.

helm comes from the local control plane's binaries (`tests/cluster/cluster build`, which CI runs
before the tests) or from PATH; without either the chart tests are skipped with that instruction.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "megatron-operator"

# Every optional object on, for the "everything enabled" render.
EVERYTHING = [
    "replicas=2",
    "podDisruptionBudget.enabled=true",
    "kueue.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.podMonitor.tokenSecret=prometheus-token",
    "alerts.enabled=true",
    "dashboard.enabled=true",
    "admissionPolicy.enabled=true",
    "admissionPolicy.allowedPriorityClasses={train-high,train-low}",
    "admissionPolicy.images.allowed={ghcr.io/megatron-operator/*,nvcr.io/nvidia/pytorch}",
    "admissionPolicy.images.requirePullPolicyAlways=true",
    "admissionPolicy.maxNodes=64",
]


@cache
def helm() -> str:
    found = os.environ.get("HELM") or shutil.which("helm")
    if found:
        return found
    proc = subprocess.run(
        [str(ROOT / "tests" / "cluster" / "cluster"), "paths"],
        capture_output=True,
        text=True,
        check=False,
    )
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    path = paths.get("helm", "")
    if not path or not Path(path).exists():
        pytest.skip("no helm binary: run `tests/cluster/cluster build` (or put helm on PATH)")
    return path


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm(), *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def render(
    *sets: str, namespace: str = "megatron-system", values: str | None = None
) -> list[dict[str, Any]]:
    args = ["template", "mo", str(CHART), "-n", namespace, *(["-f", values] if values else [])]
    for item in sets:
        args += ["--set", item]
    out = run_helm(*args).stdout
    return [o for o in yaml.safe_load_all(out) if o]


def of_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def rules_for(rules: list[dict[str, Any]], resource: str) -> set[str]:
    """The verbs the rules grant on `resource` (group-qualified names are not needed here)."""
    return {v for r in rules if resource in r.get("resources", []) for v in r["verbs"]}
