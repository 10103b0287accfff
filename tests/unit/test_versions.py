"""One version for the package, the images (the chart's appVersion) and the chart, and the
changelog names it (CHANGELOG.md)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

from megatron_operator.core.defaults import DEFAULT_TRAINER_IMAGE

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_the_images_and_the_chart_share_one_version() -> None:
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts" / "megatron-operator" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == package
    assert DEFAULT_TRAINER_IMAGE.endswith(f":{package}")
    assert f"\n## {package}" in (ROOT / "CHANGELOG.md").read_text()
