"""spec.trainer.command: a job that runs its own code. The layout rules still hold, model,
training and data become optional (and are validated when given), `mjob validate` and the CRD
agree on all of it, and the trainer side reads the config the operator writes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from megatron_contract.config import parse_config, parse_launch_config
from megatron_contract.env import RuntimeEnv
from megatron_contract.errors import ConfigError
from megatron_contract.expansion import expand
from megatron_contract.progress_log import Step, parse_line
from megatron_operator.api import SpecError, load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import config_map, pod
from megatron_trainer.validate import validate_launch

from .celcheck import check_spec
from .specs import DELETE, job_doc, spec_of

COMMAND = {
    "trainer": {"command": ["python", "train.py"], "args": ["--tp", "$(MEGATRON_TP)"]},
    "model": DELETE,
    "training": DELETE,
    "data": DELETE,
}


def _errors(spec: dict[str, Any]) -> list[str]:
    """Paths `mjob validate` names (models, then the planner)."""
    try:
        plan(load_job(job_doc(spec)).spec)
    except SpecError as exc:
        return [e.path for e in exc.errors]
    return []


def _cel(spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    return [v.field for v in check_spec(spec, old)]


def test_a_command_needs_no_model_training_or_data() -> None:
    spec = spec_of(COMMAND)
    assert _errors(spec) == [] and _cel(spec) == []
    job = load_job(job_doc(spec))
    p = plan(job.spec)
    assert p.layout_string() == "DP16" and p.memory is None and p.model is None
    cm = config_map(job, p)
    config = parse_launch_config(json.loads(cm["data"]["config.json"]))
    assert config.trainer is not None
    assert config.trainer.command == ("python", "train.py")
    assert config.trainer.args == ("--tp", "$(MEGATRON_TP)")
    assert config.model is None and config.training is None and config.data is None
    with pytest.raises(ConfigError, match="trainer"):
        parse_config(json.loads(cm["data"]["config.json"]))  # not the built-in trainer's
    env = {e["name"]: e.get("value") for e in pod(job, p, 1, 0)["spec"]["containers"][0]["env"]}
    runtime = RuntimeEnv("x", 29500, 16, 2, 1, 8, "/c", "job", None, None, 0, None, None, ())
    validate_launch(config, runtime)
    assert env["MEGATRON_TP"] == "1" and env["MEGATRON_DP"] == "16"
    assert env["MEGATRON_CHECKPOINT_DIR"] == "/mnt/checkpoints/job"


@pytest.mark.parametrize("section", ["model", "training", "data"])
def test_the_built_in_trainer_needs_each_section(section: str) -> None:
    spec = spec_of({section: DELETE})
    assert _errors(spec) and all(e.startswith("spec") for e in _errors(spec))
    assert _cel(spec) == [f"spec.{section}"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"resources.procsPerNode": 6, "parallelism.tensor": 4}, "spec.parallelism.tensor"),
        ({"parallelism.pipeline": 3}, "spec.parallelism"),
        ({"parallelism.sequenceParallel": True}, "spec.parallelism.sequenceParallel"),
        (
            {"parallelism.expert": 8, "parallelism.pipeline": 4, "resources.nodes": 3},
            "spec.parallelism.expert",
        ),
        # A given model is checked as for the built-in trainer.
        (
            {
                "model": {"recipe": "llama3-8b"},
                "parallelism.tensor": 8,
                "resources.procsPerNode": 8,
                "parallelism.sequenceParallel": True,
                "model.numAttentionHeads": 12,
            },
            "spec.parallelism.tensor",
        ),
        (
            {
                "data": {
                    "mock": True,
                    "blend": [{"weight": 1, "prefix": "/d/x"}],
                    "tokenizer": {"path": "/t"},
                }
            },
            "spec.data",
        ),
    ],
)
def test_the_layout_rules_still_hold(changes: dict[str, Any], field: str) -> None:
    spec = spec_of({**COMMAND, **changes})
    assert field in _errors(spec)
    assert field in _cel(spec)


def test_a_data_volume_alone_is_mounted_and_named() -> None:
    spec = spec_of({**COMMAND, "data": {"volume": {"claimName": "corpus", "subPath": "tok"}}})
    assert _errors(spec) == [] and _cel(spec) == []
    job = load_job(job_doc(spec))
    p = plan(job.spec)
    assert p.data is None  # no dataset section for the trainer: the command reads the volume
    container = pod(job, p, 0, 0)["spec"]["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/mnt/data")
    assert mount == {
        "name": "megatron-data",
        "mountPath": "/mnt/data",
        "readOnly": True,
        "subPath": "tok",
    }
    assert {"name": "MEGATRON_DATA_DIR", "value": "/mnt/data"} in container["env"]


def test_changing_the_command_waits_for_suspend_even_without_training() -> None:
    old = spec_of(COMMAND)
    new = spec_of({**COMMAND, "trainer": {"command": ["python", "other.py"]}})
    assert "spec" in _cel(new, old)  # the transition rule, evaluated without spec.training
    suspended = {**spec_of({**COMMAND, "suspend": True})}
    assert _cel({**new, "suspend": True}, suspended) == []


# Kubernetes' expansion (third_party/forked/golang/expansion), case for case.
@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(VAR_A)", "A"),
        ("___$(VAR_A)___", "___A___"),
        ("$(VAR_A)-$(VAR_B)", "A-B"),
        ("$(VAR_EMPTY)", ""),
        ("$(UNSET)", "$(UNSET)"),
        ("$$(VAR_A)", "$(VAR_A)"),
        ("$$$(VAR_A)", "$A"),
        ("$$$$(VAR_A)", "$$(VAR_A)"),
        ("$(VAR_A", "$(VAR_A"),
        ("$VAR_A", "$VAR_A"),
        ("${VAR_A}", "${VAR_A}"),
        ("$", "$"),
        ("x$", "x$"),
        ("$()", "$()"),
        ("--save $(MEGATRON_CHECKPOINT_DIR)/$(RANK)", "--save /ck/3"),
    ],
)
def test_expansion_follows_kubernetes(text: str, want: str) -> None:
    env = {
        "VAR_A": "A",
        "VAR_B": "B",
        "VAR_EMPTY": "",
        "MEGATRON_CHECKPOINT_DIR": "/ck",
        "RANK": "3",
    }
    assert expand(text, env) == want


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("120 2.5", Step(120, 2.5)),
        ("120", Step(120)),
        ("  7   0.25  \n", Step(7, 0.25)),
        ("120 loss=2.5 checkpoint=100", Step(120, 2.5, checkpoint_iteration=100)),
        ("5 1.0 tokens_per_second=1e5 mfu=0.4 extra=ignored", Step(5, 1.0, 1e5, 0.4)),
        ("120 nan", Step(120, None)),
        ("120 inf", Step(120, None)),
        ("step 120", None),
        ("-1 2.0", None),
        ("1.5 2.0", None),
        ("120 2.0 junk", None),
        ("99999999999999999999 1", None),
        ("", None),
        ("1 " + "x" * 5000, None),
    ],
)
def test_progress_lines(line: str, step: Step | None) -> None:
    assert parse_line(line) == step


def test_an_unknown_reference_is_refused_and_shell_syntax_and_torchrun_explained(
    capsys: pytest.CaptureFixture[str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    import yaml

    from megatron_operator.cli.main import main
    from megatron_operator.core import command

    typo = {**COMMAND, "trainer": {"command": ["python", "t.py"], "args": ["--s=$(MEGATRON_CKPT)"]}}
    with pytest.raises(SpecError) as exc:
        plan(load_job(job_doc(spec_of(typo))).spec)
    assert "spec.trainer.args[0]: $(MEGATRON_CKPT) is not set in a rank's environment" in str(
        exc.value
    )
    # A name spec.env sets, and the escaped form, are fine.
    fine = {
        **COMMAND,
        "env": [{"name": "MY_FLAG", "value": "1"}],
        "trainer": {"command": ["python", "t.py"], "args": ["$(MY_FLAG)", "$$(NOPE)"]},
    }
    job = load_job(job_doc(spec_of(fine)))
    plan(job.spec)
    assert command.warnings(job.spec) == []
    odd = {
        **COMMAND,
        "trainer": {
            "command": ["torchrun", "--nproc-per-node=8", "t.py"],
            "args": ["--rank=${RANK}", "$HOME/x"],
            "progress": "None",
        },
    }
    warned = [str(w) for w in command.warnings(load_job(job_doc(spec_of(odd))).spec)]
    assert any("${RANK} is shell syntax and is never expanded" in w for w in warned)
    assert any("$HOME is shell syntax" in w for w in warned)
    assert any("torchrun is a launcher inside the launcher" in w for w in warned)
    assert any("spec.trainer.progress: None: the job has no progress source" in w for w in warned)
    # `mjob validate -` reads stdin, and every document of a multi-document file.
    docs = [
        job_doc(spec_of(fine), name="a"),
        {"kind": "ConfigMap"},
        job_doc(spec_of(typo), name="b"),
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump_all(docs)))
    assert main(["validate", "-"]) == 2
    out = capsys.readouterr()
    assert "<stdin> (document 1): MegatronJob a is valid" in out.out
    assert "<stdin> (document 2): ConfigMap skipped" in out.out
    assert "error: <stdin> (document 3) is invalid" in out.err and "$(MEGATRON_CKPT)" in out.err
