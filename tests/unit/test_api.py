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
        ({"resources.nodes": "two"}, "spec.resources.nodes", "must be an integer"),
        (
            {"resources.nodes": "2"},
            "spec.resources.nodes",
            "must be an integer",
        ),  # strict, like k8s
        ({"resources.nodes": 2.5}, "spec.resources.nodes", "must be an integer"),
        ({"training.lr": "fast"}, "spec.training.lr", "must be a number"),
        ({"image": 5}, "spec.image", "quote it"),
        ({"resources.nodes": 0}, "spec.resources.nodes", "at least 1"),
        ({"resources.nodes": -3}, "spec.resources.nodes", "at least 1"),
        ({"parallelism.tensor": 0}, "spec.parallelism.tensor", "at least 1"),
        ({"training.lr": -1.0}, "spec.training.lr", "greater than 0"),
        ({"training.trainIters": DELETE}, "spec.training.trainIters", "required"),
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


# --- the YAML loader reads scalars as kubectl does (sigs.k8s.io/yaml, go-yaml v2)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3e-4", 3e-4),  # PyYAML's YAML 1.1 resolver reads these three as strings
        ("1E5", 1e5),
        ("-2.5e+3", -2500.0),
        (".5", 0.5),
        ("1_000", 1000),
        ("0x1F", 31),
        ("017", 15),  # YAML 1.1 octal, as go-yaml v2
        ("0o17", 15),
        ("1:30", "1:30"),  # not sexagesimal 90
        ("2024-01-01", "2024-01-01"),  # not a date
        ("=", "="),
        ("yes", True),
        ("n", False),  # go-yaml v2 reads y/n as booleans too
        ("~", None),
        ("'3e-4'", "3e-4"),  # quoted stays a string
        ("!!str 12", "12"),
        ("!!float 1", 1.0),
        ("!!binary aGk=", "hi"),  # go-yaml decodes base64 to a string
        ("!custom 12", "12"),  # and keeps the text of an application tag
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_scalars_read_as_kubectl_reads_them(text: str, value: Any) -> None:
    assert parse_yaml(f"a: {text}\n")["a"] == value


@pytest.mark.parametrize(("text", "kind"), [(".inf", 1), ("-.Inf", -1), (".NaN", 0)])
def test_special_floats_parse_and_are_left_to_the_models(text: str, kind: int) -> None:
    import math

    value = parse_yaml(f"a: {text}\n")["a"]
    assert math.isnan(value) if kind == 0 else value == kind * math.inf


def _yaml_error(text: str) -> tuple[str, str]:
    with pytest.raises(SpecError) as info:
        parse_yaml(text, "job.yaml")
    (err,) = info.value.errors
    return err.path, err.message


def test_duplicate_key_names_the_key_and_both_lines() -> None:
    path, message = _yaml_error("spec:\n  training:\n    lr: 0.1\n    x: 1\n    lr: 2\n")
    assert path == "spec.training.lr"
    assert "duplicate key 'lr'" in message and "lines 3 and 5" in message
    assert "job.yaml" in message


def test_duplicate_key_in_a_flow_mapping() -> None:
    path, _ = _yaml_error("a: {b: 1, b: 2}\n")
    assert path == "a.b"


def test_merge_keys_do_not_count_as_duplicates() -> None:
    doc = parse_yaml("base: &b {x: 1, z: 2}\nd:\n  x: 5\n  <<: *b\n")
    assert doc["d"] == {"x": 5, "z": 2}  # explicit keys win, wherever they stand


def test_integers_beyond_int64_are_refused_with_the_path() -> None:
    path, message = _yaml_error("spec:\n  resources:\n    nodes: 9223372036854775808\n")
    assert path == "spec.resources.nodes" and "64-bit" in message


def test_nesting_is_capped_without_recursion() -> None:
    path, message = _yaml_error("a: " + "[" * 200_000 + "]" * 200_000 + "\n")
    assert path.startswith("a[0][0]") and "nested deeper than 64" in message


def test_alias_expansion_is_capped() -> None:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 12)]
    _, message = _yaml_error("\n".join(lines) + "\n")
    assert "more than" in message and "aliases" in message


def test_recursive_alias_is_refused() -> None:
    _, message = _yaml_error("a: &a [1, *a]\n")
    assert "alias" in message


@pytest.mark.parametrize(
    "text", ["a: !!timestamp 2024-01-01\n", "a: !!set {x}\n", "a: !!omap [x: 1]\n"]
)
def test_other_tags_are_refused(text: str) -> None:
    _, message = _yaml_error(text)
    assert "tag" in message


def test_oversized_document() -> None:
    path, message = _yaml_error("a: " + "x" * (3 * 1024 * 1024 + 1) + "\n")
    assert path == "job.yaml" and "limit" in message


def test_set_value_beyond_int64_names_the_override() -> None:
    with pytest.raises(SpecError) as info:
        apply_overrides(job_doc(spec_of()), ["resources.nodes=99999999999999999999"])
    (err,) = info.value.errors
    assert err.path == "--set" and "64-bit" in err.message


def test_set_reads_numbers_as_kubectl() -> None:
    out = apply_overrides(job_doc(spec_of()), ["training.lr=3e-4", "image=1:30"])
    assert out["spec"]["training"]["lr"] == 3e-4
    assert out["spec"]["image"] == "1:30"


def test_bad_namespace() -> None:
    errors = _errors(job_doc(spec_of(), namespace="Not_A_Label"))
    assert "DNS label" in errors["metadata.namespace"]


def test_many_bad_items_are_reported_briefly() -> None:
    # 100 items (within the list's cap of 128), each wrong: 50 are named, then a count.
    errors = _errors(job_doc(spec_of({"env": [1] * 100})))
    assert len(errors) == 51
    assert errors["<more>"] == "50 more problems not shown"


def test_empty_toleration_key_tolerates_everything() -> None:
    job = load_job(job_doc(spec_of({"resources.tolerations": [{"key": "", "operator": "Exists"}]})))
    assert job.spec.resources.tolerations[0].key == ""


@pytest.mark.parametrize("text", ["!!int trainer", "!!float x", "!!bool maybe"])
def test_a_core_tag_on_the_wrong_text_names_the_field(text: str) -> None:
    path, message = _yaml_error(f"spec:\n  image: {text}\n")
    assert path == "spec.image" and "is not a valid !!" in message
