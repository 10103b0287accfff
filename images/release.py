"""Build a release into one directory, publishing nothing: the operator and trainer images as OCI
archives, the Helm chart package and the launcher zipapp, with their versions and
sha256 digests in `release.json`, and the commands that push them.

    python images/release.py                       # dist/: everything (buildah, docker or podman)
    python images/release.py --skip-images         # the chart and the launcher only (seconds)
    python images/release.py --registry registry.example.com/ml --trainer-build-arg TORCH=cpu \\
        --trainer-build-arg BASE=python:3.11-slim-bookworm

One version for everything (pyproject.toml, the chart's version and appVersion): the command
refuses to build when they disagree. The images are tagged `<registry>/operator:<version>` and
`<registry>/trainer:<version>`, the names the chart's defaults (image, trainerImage) point at with
the default registry. The launcher is the zipapp a trainer.command pod runs with its own image's
python3 (the operator image carries the same file; docs/bring-your-own-code.md), for other
schedulers (Slurm, enroot) too. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "megatron-operator"
DEFAULT_REGISTRY = "ghcr.io/megatron-operator"
IMAGES = {"operator": "Dockerfile.operator", "trainer": "Dockerfile.trainer"}


class ReleaseError(Exception):
    pass


def versions(root: Path = ROOT) -> dict[str, str]:
    package = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    chart = (root / "charts" / "megatron-operator" / "Chart.yaml").read_text()

    def field(name: str) -> str:
        m = re.search(rf"^{name}:\s*\"?([^\"\n]+)\"?\s*$", chart, re.M)
        if m is None:
            raise ReleaseError(f"Chart.yaml has no {name}")
        return m.group(1).strip()

    return {"package": package, "chart": field("version"), "app": field("appVersion")}


def one_version(root: Path = ROOT) -> str:
    found = versions(root)
    if len(set(found.values())) != 1:
        raise ReleaseError(
            f"the versions disagree ({found}): set pyproject.toml's version and Chart.yaml's "
            "version and appVersion to the same value, and add it to CHANGELOG.md"
        )
    version = found["package"]
    if f"\n## {version}" not in (root / "CHANGELOG.md").read_text():
        raise ReleaseError(f"CHANGELOG.md has no section for {version}")
    return version


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"


def oci_manifest_digest(archive: Path) -> str:
    """The digest of the image manifest in an OCI archive (what a registry names the image by
    once pushed): index.json's manifest entry."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"{archive}: no index.json (not an OCI archive)")
        index = json.load(member)
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ReleaseError(f"{archive}: {len(manifests)} manifests in index.json, expected 1")
    return str(manifests[0]["digest"])


def run(argv: list[str], cwd: Path = ROOT) -> str:
    print("+ " + " ".join(argv), file=sys.stderr)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ReleaseError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return proc.stdout


def image_commands(
    builder: str, name: str, ref: str, archive: Path, build_args: list[str]
) -> list[list[str]]:
    """Build `ref` from its Dockerfile and write it as an OCI archive."""
    args = [a for arg in build_args for a in ("--build-arg", arg)]
    dockerfile = IMAGES[name]
    if builder == "buildah":
        return [
            ["buildah", "bud", "--file", dockerfile, "--tag", ref, *args, "."],
            ["buildah", "push", ref, f"oci-archive:{archive}:{ref}"],
        ]
    if builder == "podman":
        return [
            ["podman", "build", "--file", dockerfile, "--tag", ref, *args, "."],
            ["podman", "save", "--format", "oci-archive", "--output", str(archive), ref],
        ]
    # Docker 25 and newer save an OCI image layout (with index.json) into the tar.
    return [
        ["docker", "build", "--file", dockerfile, "--tag", ref, *args, "."],
        ["docker", "save", "--output", str(archive), ref],
    ]


def push_commands(record: dict[str, Any], registry: str) -> list[str]:
    version = record["version"]
    lines = [
        f"skopeo copy oci-archive:{i['file']} docker://{i['ref']}"
        for i in record["images"].values()
    ]
    chart = record["chart"]["file"]
    lines.append(f"helm push {chart} oci://{registry}/charts")
    # The operator image carries the launcher; the file is for other schedulers (Slurm,
    # enroot): attach it to the release beside release.json, whose digest it must match.
    lines.append(f"# attach {record['launcher']['file']} (sha256 {record['launcher']['digest']})")
    lines.append(
        f"# then: helm install megatron-operator oci://{registry}/charts/megatron-operator "
        f"--version {version} --set image.repository={registry}/operator "
        f"--set trainerImage.repository={registry}/trainer"
    )
    return lines


def find_builder(choice: str | None) -> str:
    for name in [choice] if choice else ["buildah", "podman", "docker"]:
        if name and shutil.which(name):
            return name
    raise ReleaseError("no image builder: install buildah, podman or docker, or --skip-images")


def release(
    out: Path,
    registry: str = DEFAULT_REGISTRY,
    builder: str | None = None,
    skip_images: bool = False,
    trainer_build_args: list[str] | None = None,
    helm: str = "helm",
) -> dict[str, Any]:
    version = one_version()
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"version": version, "images": {}}
    # The launcher zipapp, from this checkout's sources (megatron_operator/zipapp.py).
    launcher = out / f"launcher-{version}.pyz"
    run([sys.executable, "-m", "megatron_operator.cli.main", "launcher", "build", str(launcher)])
    record["launcher"] = {"file": str(launcher), "digest": sha256(launcher)}
    run([helm, "package", str(CHART), "--destination", str(out)])
    chart = out / f"megatron-operator-{version}.tgz"
    record["chart"] = {"file": str(chart), "digest": sha256(chart), "version": version}
    if not skip_images:
        tool = find_builder(builder)
        for name in IMAGES:
            ref = f"{registry}/{name}:{version}"
            archive = out / f"{name}-{version}.oci.tar"
            args = (trainer_build_args or []) if name == "trainer" else []
            for argv in image_commands(tool, name, ref, archive, args):
                run(argv)
            record["images"][name] = {
                "ref": ref,
                "file": str(archive),
                "digest": oci_manifest_digest(archive),
                "archive": sha256(archive),
            }
    (out / "release.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="directory (dist/)")
    parser.add_argument("--registry", default=DEFAULT_REGISTRY, help="the images' registry/path")
    parser.add_argument("--builder", choices=["buildah", "podman", "docker"], default=None)
    parser.add_argument("--skip-images", action="store_true", help="the chart and launcher only")
    parser.add_argument(
        "--trainer-build-arg", action="append", default=[], metavar="KEY=VALUE",
        help="a build argument of Dockerfile.trainer (e.g. TORCH=cpu), repeatable",
    )  # fmt: skip
    parser.add_argument("--helm", default="helm", help="the helm binary")
    args = parser.parse_args(argv)
    try:
        record = release(
            args.out,
            args.registry,
            args.builder,
            args.skip_images,
            args.trainer_build_arg,
            args.helm,
        )
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2))
    print("\nNothing was published. To publish:")
    for line in push_commands(record, args.registry):
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
