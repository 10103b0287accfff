"""The operator ↔ trainer contract (docs/contract.md), checked from both sides.

The two packages share no imports; this test is where they meet. It renders pods with the
operator's renderer and feeds their env and config to the trainer's own parser and validator, and
checks that exit codes, recipes and the progress report mean the same on both sides.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from megatron_operator.api import load_file
from megatron_operator.api.recipes import RECIPES
from megatron_operator.api.spec import RESERVED_ENV, RestartPolicySpec
from megatron_operator.layout import plan
from megatron_operator.observe import parse_progress
from megatron_operator.policy import EXIT_CONFIG_ERROR, EXIT_SIGTERM_CHECKPOINTED, Failure, match
from megatron_operator.render import render
from megatron_trainer import config as trainer_config
from megatron_trainer.progress import Report
from megatron_trainer.validate import validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """The env a kubelet would give the container (downward API resolved)."""
    env: dict[str, str] = {}
    for item in pod["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = (
                pod["metadata"]["name"]
                if field == "metadata.name"
                else pod["metadata"]["namespace"]
            )
    return env


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_pods_parse_and_validate_in_the_trainer(path: Path, tmp_path: Path) -> None:
    job = load_file(path)
    p = plan(job.spec)
    objs = render(job, p, attempt=2)
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    config_file = tmp_path / "config.json"
    config_file.write_text(cm["data"]["config.json"])
    cfg = trainer_config.load_config(config_file)
    pods = [o for o in objs if o["kind"] == "Pod"]
    for pod in (pods[0], pods[-1]):
        env = _pod_env(pod)
        env["MEGATRON_CONFIG"] = str(config_file)
        rt = trainer_config.runtime_env(env)
        assert rt.world_size == p.world_size
        assert rt.nnodes == p.nodes and rt.nproc_per_node == p.procs_per_node
        assert rt.node_rank == int(pod["metadata"]["labels"]["megatron.dev/node-rank"])
        assert rt.restart_attempt == 2
        # Ranks contiguous per pod: the trainer's global rank matches the planner's node map.
        for local in range(rt.nproc_per_node):
            assert p.coord(rt.global_rank(local)).node == rt.node_rank
        validate(cfg, rt, check_paths=False)  # raises ConfigError with every problem
    assert cfg.parallelism.data == p.degrees.dp
    assert cfg.model.padded_vocab_size == p.padded_vocab_size


def test_exit_codes_mean_the_same_on_both_sides() -> None:
    assert trainer_config.EXIT_CONFIG == EXIT_CONFIG_ERROR == 78
    assert trainer_config.EXIT_SIGTERM == EXIT_SIGTERM_CHECKPOINTED == 143
    rules: list[Any] = list(RestartPolicySpec().rules)
    assert match(Failure("Error", trainer_config.EXIT_CONFIG), rules)[0] == "Fail"
    assert match(Failure("Error", trainer_config.EXIT_SIGTERM), rules)[0] == "RestartNotCounted"
    assert match(Failure("Error", 1), rules)[0] == "Restart"


def test_recipes_are_known_to_the_trainer() -> None:
    assert set(RECIPES) == set(trainer_config.KNOWN_RECIPES)


def test_progress_report_parses_in_the_operator() -> None:
    when = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    text = Report(120, 3.2143, 51234.5, 0.41, 100).to_json(when)
    parsed = parse_progress(text)
    assert parsed is not None
    assert (parsed.iteration, parsed.loss, parsed.checkpoint_iteration) == (120, 3.2143, 100)
    assert parsed.tokens_per_second == 51234.5 and parsed.mfu == 0.41
    assert parsed.time == when
    assert set(json.loads(text)) == {
        "iteration",
        "loss",
        "tokensPerSecond",
        "mfu",
        "checkpointIteration",
        "time",
    }
    # A diverged loss is null, which the operator accepts.
    assert parse_progress(Report(5, float("nan"), None, None, None).to_json(when)) is not None


def test_the_renderer_sets_exactly_the_reserved_env() -> None:
    job = load_file(ROOT / "examples" / "cpu-tiny.yaml")
    pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert names <= RESERVED_ENV
    assert RESERVED_ENV - names == {"MEGATRON_PROGRESS_FILE"}  # set only by mjob run --local


def test_keep_zero_means_keep_all_on_both_sides(tmp_path: Path) -> None:
    job = load_file(ROOT / "examples" / "cpu-tiny.yaml", ["checkpoint.keep=0"])
    cm = next(o for o in render(job, plan(job.spec)) if o["kind"] == "ConfigMap")
    (tmp_path / "c.json").write_text(cm["data"]["config.json"])
    assert trainer_config.load_config(tmp_path / "c.json").checkpoint.keep == 0
