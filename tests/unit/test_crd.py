"""The CRD is generated from the models, is current, is valid, and documents every field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from megatron_operator.api.crd import crd
from megatron_operator.api.gen import stale

ROOT = Path(__file__).resolve().parents[2]


def test_generated_files_are_current() -> None:
    bad = stale(ROOT)
    assert not bad, f"stale generated files {bad}: run `python -m megatron_operator.api.gen`"


def test_crd_file_is_the_generated_crd() -> None:
    on_disk = yaml.safe_load((ROOT / "crds" / "megatronjobs.megatron.dev.yaml").read_text())
    assert on_disk == crd()


def test_crd_validates_against_kubernetes_schema() -> None:
    kubernetes_validate.validate(crd(), "1.34.0", strict=True)


def test_names_and_subresources() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "megatron.dev"
    assert spec["names"]["kind"] == "MegatronJob"
    assert spec["names"]["plural"] == "megatronjobs"
    assert set(spec["names"]["shortNames"]) == {"mj", "mjob"}
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Phase",
        "Layout",
        "GPUs",
        "Restarts",
        "Progress",
        "Goodput",
        "ETA",
        "Queue",
        "Age",
    ]


def _walk(node: dict[str, Any], path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    for name, prop in node.get("properties", {}).items():
        out.append((f"{path}.{name}", prop))
        _walk(prop, f"{path}.{name}", out)
        if "items" in prop:
            _walk(prop["items"], f"{path}.{name}[]", out)


def _fields() -> list[tuple[str, dict[str, Any]]]:
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: list[tuple[str, dict[str, Any]]] = []
    _walk(root["properties"]["spec"], "spec", out)
    _walk(root["properties"]["status"], "status", out)
    return out


def test_every_field_has_a_description() -> None:
    missing = [path for path, prop in _fields() if not prop.get("description")]
    assert not missing, f"fields without a description (kubectl explain): {missing}"


def test_schema_is_structural() -> None:
    # Structural schemas: every node has a type (or int-or-string), no $ref/anyOf/allOf left.
    for path, prop in _fields():
        assert "type" in prop or prop.get("x-kubernetes-int-or-string"), path
        for key in ("$ref", "anyOf", "allOf", "oneOf", "title", "const"):
            assert key not in prop, f"{path} has {key}"


def test_contract_field_names_exist() -> None:
    names = {path for path, _ in _fields()}
    for field in [
        "spec.image",
        "spec.model.recipe",
        "spec.model.moe.numExperts",
        "spec.model.moe.routerTopK",
        "spec.parallelism.virtualPipeline",
        "spec.parallelism.expertTensor",
        "spec.parallelism.data",
        "spec.parallelism.sequenceParallel",
        "spec.training.precision",
        "spec.data.blend[].prefix",
        "spec.data.tokenizer.path",
        "spec.resources.gpuMemoryGiB",
        "spec.resources.nodeSelector",
        "spec.resources.tolerations",
        "spec.topology.mode",
        "spec.checkpoint.volume.claimName",
        "spec.checkpoint.volume.create.storageClassName",
        "spec.checkpoint.async",
        "spec.checkpoint.keep",
        "spec.restartPolicy.hangTimeoutSeconds",
        "spec.restartPolicy.rules[].action",
        "spec.suspend",
        "spec.ttlSecondsAfterFinished",
    ]:
        assert field in names, field
