"""Bad input gives field-naming errors, never a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_operator.api import SpecError, apply_overrides, load_job, parse_yaml

from .specs import DELETE, job_doc, spec_of


def _errors(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        load_job(doc)
    return {e.path: e.message for e in info.value.errors}


def test_malformed_yaml_names_line_and_column() -> None:
    with pytest.raises(SpecError) as info:
        parse_yaml("spec:\n  model: [1, 2\n  x: 3\n", "job.yaml")
    (err,) = info.value.errors
    assert err.path.startswith("job.yaml:")
    assert "malformed YAML" in err.message


@pytest.mark.parametrize("text", ["", "- a\n- b\n", "42\n", "a: 1\n---\nb: 2\n"])
def test_not_one_mapping(text: str) -> None:
    with pytest.raises(SpecError, match="expected"):
        parse_yaml(text, "job.yaml")


def test_wrong_kind() -> None:
    doc = job_doc(spec_of())
    doc["kind"] = "PyTorchJob"
    assert "apiVersion/kind" in _errors(doc)


def test_unknown_field_suggests_the_right_one() -> None:
    errors = _errors(job_doc(spec_of({"parallelism.tensr": 2})))
    msg = errors["spec.parallelism.tensr"]
    assert "unknown field" in msg and "did you mean 'tensor'" in msg


def test_snake_case_is_unknown_too() -> None:
    errors = _errors(job_doc(spec_of({"training.train_iters": 3})))
    assert "did you mean 'trainIters'" in errors["spec.training.train_iters"]


@pytest.mark.parametrize(
    ("changes", "path", "fragment"),
    [
        ({"resources.nodes": "two"}, "spec.resources.nodes", "valid integer"),
        ({"resources.nodes": "2"}, "spec.resources.nodes", "valid integer"),  # strict, like k8s
        ({"resources.nodes": 0}, "spec.resources.nodes", "at least 1"),
        ({"resources.nodes": -3}, "spec.resources.nodes", "at least 1"),
        ({"parallelism.tensor": 0}, "spec.parallelism.tensor", "at least 1"),
        ({"training.lr": -1.0}, "spec.training.lr", "greater than 0"),
        ({"training.trainIters": DELETE}, "spec.training.trainIters", "required"),
        ({"image": DELETE}, "spec.image", "required"),
        ({"parallelism.data": "many"}, "spec.parallelism.data", "'auto' or a positive integer"),
        ({"parallelism.data": 0}, "spec.parallelism.data", "'auto' or a positive integer"),
        ({"model.recipe": "gpt-huge"}, "spec.model.recipe", "gpt-tiny"),
        ({"resources.shmSize": "8GB"}, "spec.resources.shmSize", "Kubernetes quantity"),
        ({"training.precision": "int4"}, "spec.training.precision", "bf16"),
        (
            {"restartPolicy": {"rules": [{"action": "Retry", "exitCodes": [1]}]}},
            "spec.restartPolicy.rules[0].action",
            "Restart",
        ),
        (
            {"data.blend": [{"weight": 0, "prefix": "/x"}]},
            "spec.data.blend[0].weight",
            "greater than 0",
        ),
    ],
)
def test_field_errors(changes: dict[str, Any], path: str, fragment: str) -> None:
    errors = _errors(job_doc(spec_of(changes)))
    assert path in errors, errors
    assert fragment in errors[path]


def test_bad_name() -> None:
    doc = job_doc(spec_of(), name="Bad_Name")
    assert "metadata.name" in _errors(doc)
    doc = job_doc(spec_of(), name="a" * 51)
    assert "metadata.name" in _errors(doc)


def test_several_problems_reported_together() -> None:
    errors = _errors(
        job_doc(spec_of({"resources.nodes": 0, "training.lr": "fast", "model.bogus": 1}))
    )
    assert {"spec.resources.nodes", "spec.training.lr", "spec.model.bogus"} <= set(errors)


def test_overrides() -> None:
    doc = job_doc(
        spec_of({"data": {"blend": [{"weight": 1.0, "prefix": "/a"}], "tokenizer": {"path": "/t"}}})
    )
    out = apply_overrides(
        doc,
        [
            "training.trainIters=7",
            "spec.parallelism.sequenceParallel=true",
            "metadata.name=renamed",
            "data.blend.0.weight=0.5",
            "resources.nodeSelector.pool=a100",
        ],
    )
    assert out["spec"]["training"]["trainIters"] == 7
    assert out["spec"]["parallelism"]["sequenceParallel"] is True
    assert out["metadata"]["name"] == "renamed"
    assert out["spec"]["data"]["blend"][0]["weight"] == 0.5
    assert out["spec"]["resources"]["nodeSelector"] == {"pool": "a100"}
    assert doc["spec"]["training"]["trainIters"] == 100  # input untouched


@pytest.mark.parametrize("item", ["noequals", "=3", "data.blend.5.weight=1", "image.x=1"])
def test_bad_overrides(item: str) -> None:
    with pytest.raises(SpecError) as info:
        apply_overrides(
            job_doc(spec_of({"data": {"blend": [{"weight": 1.0, "prefix": "/a"}]}})), [item]
        )
    assert info.value.errors[0].path == "--set"
