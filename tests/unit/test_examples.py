"""Every example validates, plans and renders, through the CLI a user would run."""

from __future__ import annotations

import re
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


# What `mjob validate` must print for each example: the layout the example's comment promises.
INTENDED = {
    "byo-torch-ddp": "DP2 on 1 × 2 (2 ranks), memory not estimated",
    "cpu-tiny": "TP2·DP1 on 1 × 2 (2 ranks)",
    "deepseek-v2-lite": "EP8·DP16 on 2 × 8 (16 ranks)",
    "llama3-70b": "TP8·PP2·VPP5·DP4 on 8 × 8 (64 ranks)",
    "llama3-8b": "TP2·DP4 on 1 × 8 (8 ranks)",
    # The operator's choice (parallelism.auto): the best of `mjob plan --suggest` that uses only
    # parallelism a test of this project trains (CP2·DP8 ranks first, but context parallelism
    # has not run here).
    "llama3-8b-auto": "TP2·DP8 on 2 × 8 (16 ranks)",
    "llama31-8b-from-hf": "TP2·DP4 on 1 × 8 (8 ranks)",
    "megatron-bridge-recipe": "TP2·DP4 on 1 × 8 (8 ranks)",
    "megatron-lm-pretrain-gpt": "TP2·DP8 on 2 × 8 (16 ranks), memory not estimated",
    "mixtral-8x7b": "TP2·PP4·EP8·DP4 on 4 × 8 (32 ranks)",
}


def test_every_example_has_its_intended_layout() -> None:
    assert sorted(INTENDED) == sorted(p.stem for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_validate_prints_the_intended_layout(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(path)]) == 0
    assert f"is valid: {INTENDED[path.stem]}" in capsys.readouterr().out


def _plan(name: str) -> dict[str, object]:
    from megatron_operator.api import load_file
    from megatron_operator.core.planner import plan

    return plan(load_file(ROOT / "examples" / f"{name}.yaml").spec).to_dict(False)


def test_deepseek_is_the_bridge_layout_with_its_own_routing() -> None:
    from megatron_operator.api import load_file
    from megatron_operator.core.planner import plan

    ds = _plan("deepseek-v2-lite")
    # TP1 · EP8: no expert tensor parallelism, so no 1,408-wide expert is cut into 176-wide
    # shards; the 8 expert ranks are one pod's 8 GPUs.
    assert (ds["tensor"], ds["expert"], ds["expertTensor"]) == (1, 8, 1)
    assert ds["procsPerNode"] == ds["expert"]
    model = plan(load_file(ROOT / "examples" / "deepseek-v2-lite.yaml").spec).model
    assert model is not None and model.moe is not None and model.mla is not None
    assert model.moe.router_pre_softmax  # softmax over all experts, then top-6
    assert model.rope_scaling is None  # 4K pre-training: plain RoPE (YaRN is refused by name)


def test_llama3_70b_fits_without_full_recompute() -> None:
    from megatron_operator.api import load_file

    big = _plan("llama3-70b")
    spec = load_file(ROOT / "examples" / "llama3-70b.yaml").spec
    assert spec.training is not None and spec.training.recompute != "full"
    assert spec.resources.gpu_memory_gib == 70
    assert big["memory"]["perGpuGiB"] <= 70  # type: ignore[index]
    assert big["tensor"] == 8 and big["sequenceParallel"]  # TP inside the NVLink domain


def test_the_tiny_example_fits_kinds_storage() -> None:
    from megatron_operator.api import load_file

    spec = load_file(ROOT / "examples" / "cpu-tiny.yaml").spec
    create = spec.checkpoint.volume.create
    assert create is not None and create.access_modes == ["ReadWriteOnce"]
    assert create.storage_class_name is None  # the cluster's default class


@pytest.mark.parametrize(
    "path",
    [p for p in EXAMPLES if "\n  trainer:\n" in p.read_text()],
    ids=lambda p: p.stem,
)
def test_a_commands_variables_are_the_operators(path: Path) -> None:
    import re

    from megatron_contract.env import OWNED
    from megatron_operator.api import load_file

    spec = load_file(path).spec
    assert spec.trainer is not None
    words = [*spec.trainer.command, *spec.trainer.args]
    names = {m for w in words for m in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", w)}
    assert names and names <= OWNED, names - OWNED
    if "MEGATRON_DATA_DIR" in names:
        assert spec.data is not None and spec.data.volume is not None


def test_the_license_file_is_the_one_pyproject_names() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_an_example_says_what_it_needs_in_the_namespace(path: Path) -> None:
    """Every claim, StorageClass and Secret an example uses but does not create is named in its
    first lines, so that the job runs as written once those exist."""
    text = path.read_text()
    header = text.split("\napiVersion:", 1)[0]
    needed = re.findall(r"claimName: ([a-z0-9-]+)", text)
    needed += re.findall(r"storageClassName: ([a-z0-9-]+)", text)
    needed += re.findall(r"configSecret: ([a-z0-9-]+)", text)
    for name in needed:
        assert name in header, f"{path.name}: the header does not say it needs {name}"


@pytest.mark.parametrize(
    "path",
    [p for p in EXAMPLES if "\n  trainer:\n" in p.read_text()],
    ids=lambda p: p.stem,
)
def test_own_code_runs_in_its_own_image_with_the_launcher_from_the_operators(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mjob render` of an own-code example: the user's image runs unchanged, the operator's
    image copies the launcher into an emptyDir, and the image's python3 runs it."""
    from megatron_contract.paths import LAUNCHER_MOUNT, LAUNCHER_ZIPAPP
    from megatron_operator.core.defaults import DEFAULT_LAUNCHER_IMAGE

    assert main(["render", str(path)]) == 0
    pods = [o for o in yaml.safe_load(capsys.readouterr().out)["items"] if o["kind"] == "Pod"]
    image = yaml.safe_load(path.read_text())["spec"].get("image")
    for pod in pods:
        (init,) = pod["spec"]["initContainers"]
        assert init["image"] == DEFAULT_LAUNCHER_IMAGE
        assert init["command"] == ["mjob", "launcher", "install", LAUNCHER_ZIPAPP]
        (trainer,) = pod["spec"]["containers"]
        assert trainer["command"] == ["python3", LAUNCHER_ZIPAPP]
        assert image is None or trainer["image"] == image
        mount = next(m for m in trainer["volumeMounts"] if m["mountPath"] == LAUNCHER_MOUNT)
        assert mount["readOnly"] is True
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
        assert "emptyDir" in volume
        assert pod["metadata"]["annotations"]["megatron.dev/restart-strategy"] == "InPlace"


def test_no_doc_or_example_installs_this_project_into_an_image() -> None:
    """The launcher is never pip-installed into a training image: the name is not on the
    package index (anyone could register it)."""
    texts = [*ROOT.glob("docs/*.md"), *ROOT.glob("examples/*.yaml"), ROOT / "README.md"]
    texts += [ROOT / "images" / "README.md", ROOT / "images" / "enroot.md"]
    for f in texts:
        for line in f.read_text().splitlines():
            if "pip install" in line:
                assert "megatron-operator" not in line and "megatron_operator" not in line, (
                    f"{f.name}: {line.strip()}"
                )
