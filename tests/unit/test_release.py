"""images/release.py: one version or no release; the chart package and the launcher zipapp with
their digests; the images' build and OCI-archive commands; an OCI archive's manifest digest."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

from megatron_operator import zipapp

from .chartkit import ROOT, helm


def _release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", ROOT / "images" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = _release()


def test_one_version_or_no_release(tmp_path: Path) -> None:
    assert release.one_version() == release.versions()["package"]
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    chart = tmp_path / "charts" / "megatron-operator"
    chart.mkdir(parents=True)
    text = (ROOT / "charts" / "megatron-operator" / "Chart.yaml").read_text()
    (chart / "Chart.yaml").write_text(text.replace("appVersion:", 'appVersion: "9.9.9"\n#'))
    with pytest.raises(release.ReleaseError, match="the versions disagree"):
        release.one_version(tmp_path)


def test_the_manifest_digest_of_an_oci_archive(tmp_path: Path) -> None:
    manifest = b'{"schemaVersion": 2}'
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{"digest": digest, "size": len(manifest)}]}
    archive = tmp_path / "x.oci.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("index.json", json.dumps(index).encode()), ("oci-layout", b"{}")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert release.oci_manifest_digest(archive) == digest


def test_images_are_built_from_the_dockerfiles_and_saved_as_oci_archives() -> None:
    out = Path("dist/trainer-1.oci.tar")
    ref = "registry.example/ml/trainer:1"
    cmds = release.image_commands("buildah", "trainer", ref, out, ["TORCH=cpu"])
    assert cmds[0][:4] == ["buildah", "bud", "--file", "Dockerfile.trainer"]
    assert cmds[0][6:8] == ["--build-arg", "TORCH=cpu"]
    assert cmds[1] == ["buildah", "push", ref, f"oci-archive:{out}:{ref}"]
    podman = release.image_commands("podman", "operator", ref, out, [])
    assert podman[1][:4] == ["podman", "save", "--format", "oci-archive"]
    assert release.image_commands("docker", "operator", ref, out, [])[1][:2] == ["docker", "save"]


def test_the_chart_and_the_launcher_with_their_digests(tmp_path: Path) -> None:
    record = release.release(tmp_path / "dist", skip_images=True, helm=helm())
    version = record["version"]
    chart, launcher = Path(record["chart"]["file"]), Path(record["launcher"]["file"])
    assert chart.name == f"megatron-operator-{version}.tgz"
    assert launcher.name == f"launcher-{version}.pyz"
    assert launcher.read_bytes() == zipapp.build_bytes(version)  # reproducible
    for item in (record["chart"], record["launcher"]):
        assert item["digest"] == release.sha256(Path(item["file"]))
    with tarfile.open(chart) as tar:
        meta = tar.extractfile("megatron-operator/Chart.yaml")
        assert meta is not None and f"appVersion: {version}" in meta.read().decode().replace(
            '"', ""
        )
    assert json.loads((tmp_path / "dist" / "release.json").read_text()) == record
    pushes = release.push_commands(record, "registry.example/ml")
    assert f"helm push {chart} oci://registry.example/ml/charts" in pushes
