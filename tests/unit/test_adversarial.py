"""Bad input never crashes `mjob`: every adversarial file gives exit 2, a message naming the field,
no traceback, and an answer within seconds. The same table runs against the real apiserver in
tests/integration/test_crd_apiserver.py, which must refuse every one of them too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_operator.api import load_file
from megatron_operator.api.crd import crd
from megatron_operator.cli.main import main

from .adversarial import CASES, WORST_YAML, Case, _file, validate_in_new_process
from .celcheck import check_spec
from .specs import spec_of

# Measured at 0.15 s for the slowest case (benchmarks/adversarial_specs.py, docs/benchmarks.md);
# the bound only catches a hang or an accidentally quadratic path, on a machine shared with
# compilers.
SECONDS_PER_CASE = 10.0


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_validate_refuses_with_the_field(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(case.text, encoding="utf-8")
    start = time.perf_counter()
    code = main(["validate", str(path)])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2, err
    assert out == ""
    assert case.field in err, err[:2000]
    assert "Traceback" not in err and "internal error" not in err, err[:2000]
    assert len(err) < 20_000, "the message must stay readable"
    assert elapsed < SECONDS_PER_CASE, f"{case.id}: {elapsed:.2f} s"


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    # In-process main() above; here the installed entry point, for the worst YAML cases.
    picked = [c for c in CASES if c.id in WORST_YAML]
    assert {c.id for c in picked} == WORST_YAML, "a WORST_YAML id names no case"
    for case in picked:
        path = tmp_path / "job.yaml"
        path.write_text(case.text, encoding="utf-8")
        proc = validate_in_new_process(path)
        assert proc.returncode == 2, proc.stderr
        assert case.field in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["3e-4", "3E-4", "0.0003", "3.0e-4", "3e-04"])
def test_lr_written_the_ml_way_is_accepted(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(_file({}).replace("  training:\n", f"  training:\n    lr: {text}\n"))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert load_file(path).spec.training.lr == pytest.approx(3e-4)


def test_lr_by_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(_file({}))
    assert main(["validate", str(path), "--set", "training.lr=3e-4"]) == 0
    capsys.readouterr()
    assert load_file(path, ["training.lr=3e-4"]).spec.training.lr == pytest.approx(3e-4)
    assert load_file(path, ["training.minLr=1E-5"]).spec.training.min_lr == pytest.approx(1e-5)
    assert main(["validate", str(path), "--set", "training.lr=.inf"]) == 2
    assert "spec.training.lr" in capsys.readouterr().err


def _numbers(node: dict[str, Any], path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    if node.get("type") in ("integer", "number") or node.get("x-kubernetes-int-or-string"):
        out.append((path, node))
    for name, prop in node.get("properties", {}).items():
        _numbers(prop, f"{path}.{name}", out)
    if "items" in node:
        _numbers(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _numbers(node["additionalProperties"], f"{path}.*", out)


def _spec_schema() -> dict[str, Any]:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec: dict[str, Any] = root["properties"]["spec"]
    return spec


def test_every_number_in_the_schema_has_a_maximum() -> None:
    found: list[tuple[str, dict[str, Any]]] = []
    _numbers(_spec_schema(), "spec", found)
    assert len(found) > 50
    unbounded = [p for p, n in found if "maximum" not in n]
    assert not unbounded, f"numbers without a maximum: {unbounded}"


def _strings(node: dict[str, Any], path: str, out: list[str]) -> None:
    if node.get("type") == "string" and "maxLength" not in node and "enum" not in node:
        out.append(path)
    for name, prop in node.get("properties", {}).items():
        _strings(prop, f"{path}.{name}", out)
    if "items" in node:
        _strings(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _strings(node["additionalProperties"], f"{path}.*", out)


def test_every_string_in_the_schema_has_a_length_cap() -> None:
    unbounded: list[str] = []
    _strings(_spec_schema(), "spec", unbounded)
    assert not unbounded, f"strings without maxLength: {unbounded}"


# The bounds that need CEL (a schema cannot state them), evaluated with cel-python here and on
# the real apiserver in the integration test.
CEL_CASES = {
    "world size above the cap": "spec.resources",
    "nodes and spares above the pod cap": "spec.resources",
    "nodeSelector key with space": "spec.resources.nodeSelector",
    "nodeSelector key bad prefix": "spec.resources.nodeSelector",
    "nodeSelector key prefix too long": "spec.resources.nodeSelector",
    "tokenizer path with ..": "spec.data.tokenizer.path",
    "blend prefix with ..": "spec.data.blend[0].prefix",
}


@pytest.mark.parametrize(("case_id", "where"), CEL_CASES.items())
def test_cel_rules_refuse_the_cross_field_bounds(case_id: str, where: str) -> None:
    (case,) = [c for c in CASES if c.id == case_id]
    spec = yaml.safe_load(case.text)["spec"]
    found = {v.field for v in check_spec(spec)}
    assert where in found, found


def test_cel_rules_accept_good_keys_and_paths() -> None:
    spec = spec_of(
        {
            "resources.nodeSelector": {"example.com/pool": "a100", "rack": ""},
            "data": {
                "blend": [{"weight": 1.0, "prefix": "/data/.cache/a"}],
                "tokenizer": {"path": "/t"},
            },
            "resources.nodes": 4096,
            "resources.procsPerNode": 16,
            "training.globalBatchSize": 65536,
        }
    )
    assert check_spec(spec) == []


def test_node_selector_keeps_its_value_schema() -> None:
    # A pattern on the key type once became patternProperties, which the structural schema
    # dropped: the apiserver would have pruned every nodeSelector to {}.
    node = _spec_schema()["properties"]["resources"]["properties"]["nodeSelector"]
    assert node["additionalProperties"]["maxLength"] == 63
    assert "patternProperties" not in node
