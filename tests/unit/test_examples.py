"""Every example validates, plans and renders, through the CLI a user would run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from megatron_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"cpu-tiny", "llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v2-lite"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates_plans_and_renders(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(path)]) == 0
    assert "is valid" in capsys.readouterr().out
    assert main(["plan", str(path), "-o", "json"]) == 0
    plan = yaml.safe_load(capsys.readouterr().out)
    assert len(plan["ranks"]) == plan["worldSize"]
    assert main(["plan", str(path), "-o", "table"]) == 0
    assert "Plan:" in capsys.readouterr().out
    assert main(["render", str(path)]) == 0
    objs = yaml.safe_load(capsys.readouterr().out)["items"]
    assert sum(o["kind"] == "Pod" for o in objs) == plan["nodes"]


def test_seed_recipe_layouts() -> None:
    def plan_of(name: str) -> dict[str, object]:
        from megatron_operator.api import load_file
        from megatron_operator.core.planner import plan

        return plan(load_file(ROOT / "examples" / f"{name}.yaml").spec).to_dict(False)

    ds = plan_of("deepseek-v2-lite")
    assert (ds["tensor"], ds["expert"], ds["sequenceParallel"], ds["nodes"]) == (8, 2, True, 2)
    assert (ds["globalBatchSize"], ds["microBatchSize"]) == (64, 1)
    tiny = plan_of("cpu-tiny")
    assert (tiny["tensor"], tiny["worldSize"]) == (2, 2)
    big = plan_of("llama3-70b")
    assert (big["tensor"], big["pipeline"]) == (4, 2) and big["nodes"] > 1
    assert plan_of("mixtral-8x7b")["expert"] > 1
    assert plan_of("llama3-8b")["nodes"] == 1
