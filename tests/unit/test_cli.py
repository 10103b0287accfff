"""`mjob` as a user runs it: exit codes, stderr messages, and no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from megatron_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "cpu-tiny.yaml")


def _mjob(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "megatron_operator.cli.main", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("spec: [unclosed\n", "malformed YAML"),
        (
            "apiVersion: megatron.dev/v1alpha1\nkind: MegatronJob\nmetadata: {name: x}\nspec: {}\n",
            "required",
        ),
        ("just a string\n", "expected a MegatronJob mapping"),
    ],
)
def test_bad_files_exit_2_without_traceback(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(content)
    for cmd in ("validate", "plan", "render"):
        proc = _mjob(cmd, str(path))
        assert proc.returncode == 2, proc.stderr
        assert fragment in proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_missing_file(tmp_path: Path) -> None:
    proc = _mjob("validate", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "cannot read the file" in proc.stderr and "Traceback" not in proc.stderr


def test_invalid_layout_lists_every_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", TINY, "--set", "parallelism.tensor=4", "--set", "training.minLr=1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "spec.parallelism.tensor" in err and "spec.training.minLr" in err
    assert "2 problems" in err or "3 problems" in err


def test_bad_set_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", TINY, "--set", "no-equals-sign"]) == 2
    assert "path=value" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        # 60,000 levels: the YAML reader's depth cap does not see a --set path.
        ("metadata." + "x." * 60_000 + "x=1", "the path is nested deeper than 64 levels"),
        # A short path with a deep value: together deeper than the cap.
        ("metadata." + "x." * 40 + "x=" + "[" * 30 + "]" * 30, "nested deeper than 64 levels"),
    ],
)
def test_set_cannot_nest_past_the_depth_cap(
    override: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", TINY, "--set", override]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_run_local_refuses_env_that_loads_code_on_this_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`mjob run --local` passes spec.env to processes on this machine: LD_PRELOAD or
    PYTHONPATH from someone else's YAML would run their code here. Refused before anything
    starts, naming the entry; --trust-env lets a user run their own file."""
    env = "env=[{name: NCCL_DEBUG, value: INFO}, {name: LD_PRELOAD, value: /tmp/x.so}, {name: PYTHONPATH, value: /tmp}]"
    assert main(["run", TINY, "--local", "--set", env]) == 2
    err = capsys.readouterr().err
    assert "spec.env[1].name: LD_PRELOAD" in err and "spec.env[2].name: PYTHONPATH" in err
    assert "NCCL_DEBUG" not in err and "--trust-env" in err


def test_run_local_refuses_the_templates_trainer_env_that_loads_code_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The template's trainer env is merged into the same environment as spec.env.
    trainer = "{name: trainer, env: [{name: OMP_NUM_THREADS, value: '1'}, {name: LD_PRELOAD, value: /tmp/x.so}]}"
    template = f"template={{spec: {{containers: [{trainer}]}}}}"
    assert main(["run", TINY, "--local", "--set", template]) == 2
    err = capsys.readouterr().err
    assert "spec.template.spec.containers[0].env[1].name: LD_PRELOAD" in err, err
    assert "OMP_NUM_THREADS" not in err and "--trust-env" in err


def test_unknown_argument_exits_2() -> None:
    proc = _mjob("plan", TINY, "--frobnicate")
    assert proc.returncode == 2 and "unrecognized arguments" in proc.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--leader-elect"], "--leader-elect needs --leader-election-namespace or $POD_NAMESPACE"),
        (["--metrics-port=70000"], "--metrics-port and --health-port must be 0-65535"),
        (["--health-port=8080"], "--metrics-port and --health-port must differ"),
        (
            ["--metrics-bind-address=0.0.0.0", "--metrics-auth=none"],
            "--metrics-auth none on 0.0.0.0",
        ),
        (["--claim-key-file=/nonexistent"], "--claim-key-file: cannot read /nonexistent"),
        (["--workers=0"], "--workers ≥ 1"),
        (["--kueue=maybe"], "invalid choice: 'maybe'"),
    ],
)
def test_operator_flags_refused_before_connecting(
    args: list[str], fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    proc = _mjob("operator", *args)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_plan_json_has_the_contract_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", TINY, "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in [
        "worldSize",
        "nodes",
        "procsPerNode",
        "tensor",
        "pipeline",
        "virtualPipeline",
        "context",
        "expert",
        "expertTensor",
        "data",
        "numMicrobatches",
        "paddedVocabSize",
    ]:
        assert key in plan, key
    assert isinstance(plan["memory"]["perGpuGiB"], float)
    assert set(plan["ranks"][0]) == {
        "rank",
        "node",
        "localRank",
        "tp",
        "cp",
        "dp",
        "pp",
        "ep",
        "etp",
        "edp",
    }


def test_render_restart_attempt_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", TINY, "--restart-attempt", "4", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "List"
    pods = [o for o in doc["items"] if o["kind"] == "Pod"]
    assert pods[0]["metadata"]["labels"]["megatron.dev/restart-attempt"] == "4"
    assert main(["render", TINY, "--restart-attempt", "-1"]) == 2


@pytest.mark.parametrize("fmt", ["yaml", "json"])
@pytest.mark.parametrize("example", ["cpu-tiny.yaml", "mixtral-8x7b.yaml"])
def test_render_streams_the_same_text_as_one_list(fmt: str, example: str) -> None:
    """`mjob render` writes one object at a time; the text is what dumping the whole List gives."""
    from megatron_operator.cli.common import dump, load_and_plan
    from megatron_operator.cli.yamlio import write_list
    from megatron_operator.core.render import as_list, render, render_iter

    job, p = load_and_plan(str(ROOT / "examples" / example), [])
    chunks: list[str] = []
    write_list(render_iter(job, p, 2), fmt, chunks.append)
    assert "".join(chunks) == dump(as_list(render(job, p, 2)), fmt)
    empty: list[str] = []
    write_list([], fmt, empty.append)
    assert "".join(empty) == dump(as_list([]), fmt)


def test_set_applies_to_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", TINY, "--set", "training.trainIters=1000"]) == 0
    objs = yaml.safe_load(capsys.readouterr().out)["items"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    assert json.loads(cm["data"]["config.json"])["training"]["trainIters"] == 1000


def test_crd_command_prints_the_crd(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["kind"] == "CustomResourceDefinition"


def test_mjob_run_local_says_what_it_cannot_do() -> None:
    from megatron_operator.api import load_file
    from megatron_operator.cli.run import local_notes

    root = Path(__file__).resolve().parents[2]
    assert local_notes(load_file(root / "examples" / "cpu-tiny.yaml")) == []
    job = load_file(
        root / "examples" / "cpu-tiny.yaml",
        [
            "template.spec.containers=[{name: trainer, env: [{name: KEY, valueFrom: "
            "{secretKeyRef: {name: s, key: k}}}]}, {name: exporter, image: x:1}]",
            "data.volume.claimName=corpus",
        ],
    )
    notes = local_notes(job)
    assert "env from Secrets, ConfigMaps or the pod (KEY) is not set locally" in notes
    assert "the template's other containers (exporter) do not run locally" in notes
    assert any("data.volume (/mnt/data → <workdir>/data)" in n for n in notes)
