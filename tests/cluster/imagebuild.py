"""`cluster images`: the operator and CPU trainer images, built with buildah from our Dockerfiles.

No registry can be reached, so the base is made here: a Debian root filesystem from mmdebstrap
(Debian's own mirror; several times faster than debootstrap: apt resolves and downloads in
parallel, and dpkg unpacks in one pass) with Python 3.11 and a virtual environment on PATH,
committed with `buildah from scratch`. The Dockerfiles take it through `ARG BASE`; their published defaults stay.

Every image is cached as an OCI archive under ~/.cache/megatron-operator/images/, named by a digest
of what goes into it (Dockerfile, .dockerignore, pyproject.toml, README.md, operator/, trainer/,
images/, the base's digest, the build recipe), so a second run with the same sources only prints
the references. buildah's own storage (overlay driver) is kept under the same cache directory, with
its layer cache: Dockerfile.trainer installs torch and megatron-core before it copies our sources,
so a source change rebuilds only the last layers (minutes, not the ~20 min of a full build).

Python standard library only; uses `mmdebstrap` and `buildah` (Debian packages, installed when
missing by hostpkgs.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from common import CliError, die, log

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Bump when the way images are made changes, to invalidate cached archives.
RECIPE = "2"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# bookworm's python3 is 3.11, the version the project supports (requires-python >= 3.11).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
VENV = "/opt/venv"
REPO_PREFIX = "localhost/megatron-operator"

# What goes into the operator and trainer images (the build context after .dockerignore).
CONTEXT = (
    "pyproject.toml",
    "README.md",
    ".dockerignore",
    "operator",
    "trainer",
    "images",
    "examples/scripts",
)
SKIP_PARTS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megatron-operator" / "images"


def require_tools(*names: str) -> None:
    """Install the Debian packages of these commands if they are missing (as root)."""
    # hostpkgs.py lies beside this file. The `cluster` driver runs with this folder on sys.path;
    # a test that imported this module may have taken it off again, and only a machine without
    # the cached Python roots comes here (a cold run), so say where it is.
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import hostpkgs

    hostpkgs.ensure({name: name for name in names})


def run(argv: Sequence[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-4000:]
        die(f"{what} failed (exit {proc.returncode}): `{' '.join(argv)[:300]}`\n{tail}")
    return proc.stdout


def run_logged(argv: Sequence[str], what: str, logfile: Path, cwd: Path | None = None) -> None:
    """Run a long step with its output in a log file (a build prints thousands of lines)."""
    with logfile.open("ab") as out:
        proc = subprocess.run(
            list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        lines = logfile.read_text(errors="replace").splitlines()[-40:]
        die(
            f"{what} failed (exit {proc.returncode}); last lines of {logfile}:\n" + "\n".join(lines)
        )


class Buildah:
    """buildah with its own storage under the cache. The overlay driver (root, kernel overlayfs)
    stores each layer as a diff; vfs, which needs no overlay mounts, copies the whole root
    filesystem for every layer (4.5 GB for the trainer's), which made a cached layer cost
    minutes. MEGATRON_BUILDAH_DRIVER=vfs selects it where overlay mounts are refused."""

    def __init__(self, root: Path) -> None:
        self.driver = os.environ.get("MEGATRON_BUILDAH_DRIVER", "overlay")
        if self.driver not in ("overlay", "vfs"):
            die(f"MEGATRON_BUILDAH_DRIVER must be overlay or vfs, not {self.driver!r}")
        self.root = root / self.driver

    def argv(self, *args: str) -> list[str]:
        return [
            "buildah",
            "--storage-driver",
            self.driver,
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            *args,
        ]

    def __call__(self, *args: str, what: str = "buildah") -> str:
        return run(self.argv(*args), what).strip()

    def has_image(self, ref: str) -> bool:
        proc = subprocess.run(
            self.argv("inspect", "--type", "image", ref), capture_output=True, check=False
        )
        return proc.returncode == 0


@dataclass(frozen=True)
class Image:
    name: str  # operator, trainer
    ref: str
    archive: Path


def digest_paths(h: hashlib._Hash, paths: Sequence[Path]) -> None:
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(REPO)
            if SKIP_PARTS & set(rel.parts) or f.suffix == ".pyc" or ".egg-info" in str(rel):
                continue
            h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")


def base_key() -> str:
    h = hashlib.sha256(f"{RECIPE}|{DEBIAN_SUITE}|{','.join(BASE_PACKAGES)}|{VENV}".encode())
    return h.hexdigest()[:12]


def image_key(dockerfile: str, base: str, build_args: dict[str, str]) -> str:
    h = hashlib.sha256(f"{RECIPE}|{base}|{json.dumps(build_args, sort_keys=True)}".encode())
    digest_paths(h, [REPO / dockerfile, *(REPO / c for c in CONTEXT)])
    return h.hexdigest()[:12]


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another image build holding {path}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def push_archive(b: Buildah, ref: str, archive: Path) -> None:
    """Export to an uncompressed OCI archive (compressing gigabytes of wheels buys nothing on a
    local disk and costs minutes); written aside and renamed, so a cache entry is whole."""
    tmp = archive.with_name(archive.name + ".partial")
    tmp.unlink(missing_ok=True)
    b("push", "--disable-compression", ref, f"oci-archive:{tmp}:{ref}", what=f"exporting {ref}")
    tmp.rename(archive)


def build_base(b: Buildah, ref: str, archive: Path, logfile: Path) -> None:
    require_tools("mmdebstrap")
    with tempfile.TemporaryDirectory(prefix="base-", dir=cache_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"mmdebstrap {DEBIAN_SUITE} (minbase + {', '.join(BASE_PACKAGES)}) ...")
        run_logged(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                f"--include={','.join(BASE_PACKAGES)}",
                # No documentation or translations in a container image.
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-include=/usr/share/doc/*/copyright",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            "mmdebstrap",
            logfile,
        )
        # A virtual environment on PATH: `pip install` then works as in the slim Python image
        # (Debian's own interpreter refuses it, PEP 668), and nothing touches /usr.
        run_logged(["chroot", str(rootfs), "python3", "-m", "venv", VENV], "venv", logfile)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (rootfs / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        container = b("from", "scratch")
        try:
            mount = Path(b("mount", container))
            run(["cp", "-a", f"{rootfs}/.", str(mount)], "copying the root filesystem")
            b("umount", container)
            path = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            b(
                "config",
                "--env",
                f"PATH={path}",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                '["python3"]',
                "--label",
                f"megatron.dev/base=debian-{DEBIAN_SUITE}-python",
                container,
            )
            b("commit", "--quiet", container, ref, what=f"committing {ref}")
        finally:
            with contextlib.suppress(CliError):
                b("rm", container)
    push_archive(b, ref, archive)


# Other Debian releases' Python, for the launcher's version test (tests/trainer/
# test_launcher_zipapp.py): the launcher runs with whatever python3 a training image has.
PYTHON_SUITES = {"bullseye": "3.9", "trixie": "3.13"}


def python_root(suite: str) -> Path:
    """A cached minbase root filesystem of `suite` with its python3 (made once, ~1 min), for
    `chroot ROOT python3 ...`. Written aside and renamed, so a cached root is whole."""
    if suite not in PYTHON_SUITES:
        die(f"no Python root for {suite!r}; known: {', '.join(PYTHON_SUITES)}")
    root = cache_dir().parent / "python-roots" / f"{suite}-{RECIPE}"
    if (root / "usr" / "bin" / "python3").exists():
        return root
    require_tools("mmdebstrap")
    with locked(root.parent / ".lock"):
        if (root / "usr" / "bin" / "python3").exists():
            return root
        partial = root.with_name(root.name + ".partial")
        subprocess.run(["rm", "-rf", str(partial)], check=False)
        logfile = root.parent / f"{suite}.log"
        log(f"mmdebstrap {suite} (minbase + python3) for the launcher's version test ...")
        run_logged(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--mode=root",
                "--include=python3",
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                suite,
                str(partial),
                DEBIAN_MIRROR,
            ],
            f"mmdebstrap {suite}",
            logfile,
        )
        partial.rename(root)
    return root


HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def trust_mounts() -> list[tuple[Path, str]]:
    """The host's CA bundle and a pip.conf that uses it, mounted into RUN steps only (nothing is
    left in the image). Where PyPI is reached through a TLS-inspecting proxy, its CA is in the
    host's bundle but not in the image's; elsewhere this changes nothing."""
    if not HOST_CA_BUNDLE.is_file():
        return []
    conf = cache_dir() / "pip-build.conf"
    conf.write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
    return [(HOST_CA_BUNDLE, str(HOST_CA_BUNDLE)), (conf, "/etc/pip.conf")]


def build_image(
    b: Buildah,
    dockerfile: str,
    ref: str,
    archive: Path,
    build_args: dict[str, str],
    logfile: Path,
) -> None:
    argv = b.argv(
        "bud",
        "--file",
        str(REPO / dockerfile),
        "--tag",
        ref,
        # The layer cache: unchanged steps (the dependencies) are reused.
        "--layers",
        # pip reaches PyPI directly, as on the host: no bridge and no NAT for the build.
        "--network",
        "host",
        "--isolation",
        "chroot",
    )
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    for host, inside in trust_mounts():
        argv += ["--volume", f"{host}:{inside}:ro"]

    argv.append(str(REPO))
    log(f"building {ref} from {dockerfile} (log: {logfile})")
    run_logged(argv, f"building {dockerfile}", logfile)
    push_archive(b, ref, archive)


def ensure_images(verbose: bool = True) -> dict[str, Image]:
    """Build what is missing; return {base, operator, trainer}."""
    require_tools("buildah")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    b = Buildah(cache / "buildah")
    logs = cache / "logs"
    logs.mkdir(exist_ok=True)
    out: dict[str, Image] = {}
    with locked(cache / ".lock"):
        t0 = time.monotonic()
        bkey = base_key()
        base_ref = f"{REPO_PREFIX}/base-python:{DEBIAN_SUITE}-{bkey}"
        base = Image("base", base_ref, cache / f"base-{bkey}.oci.tar")
        out["base"] = base
        specs = (
            ("operator", "Dockerfile.operator", {"BASE": base_ref}),
            ("trainer", "Dockerfile.trainer", {"BASE": base_ref, "TORCH": "cpu"}),
        )
        todo = []
        for name, dockerfile, args in specs:
            key = image_key(dockerfile, bkey, args)
            ref = f"{REPO_PREFIX}/{name}:{key}"
            img = Image(name, ref, cache / f"{name}-{key}.oci.tar")
            out[name] = img
            if not img.archive.is_file():
                todo.append((img, dockerfile, args))
        if not base.archive.is_file():
            t = time.monotonic()
            build_base(b, base_ref, base.archive, logs / f"base-{bkey}.log")
            log(f"base image {base_ref} made in {time.monotonic() - t:.0f} s")
        if todo and not b.has_image(base_ref):
            b("pull", f"oci-archive:{base.archive}", what="loading the base image")
        for img, dockerfile, args in todo:
            t = time.monotonic()
            # One log per image key: worktrees and branches build different keys, and a failure
            # must show its own build's lines.
            logfile = logs / img.archive.name.replace(".oci.tar", ".log")
            build_image(b, dockerfile, img.ref, img.archive, args, logfile)
            log(f"{img.name} image {img.ref} built in {time.monotonic() - t:.0f} s")
        prune(b, cache, keep={i.archive for i in out.values()}, verbose=verbose)
        if verbose:
            log(f"images ready in {time.monotonic() - t0:.1f} s")
    return out


# Archives of one image name kept besides the one just built: other checkouts (branches,
# worktrees) build other keys on the same machine, and a rebuild costs minutes; without a bound,
# every change to the trainer leaves ~6 GB (its archive and its layers) until the disk is full.
# One older: the session's real nodes need ~20 GB of their own (the trainer unpacked in 3 nodes).
KEEP_OLDER = 1


def prune(b: Buildah, cache: Path, keep: set[Path], verbose: bool) -> None:
    """Remove all but the KEEP_OLDER newest older archives of each image name, and their images
    in the build store. Runs under the cache's lock, so no build is using them."""
    by_name: dict[str, list[Path]] = {}
    for archive in cache.glob("*.oci.tar"):
        if archive not in keep:
            by_name.setdefault(archive.name.rsplit("-", 1)[0], []).append(archive)
    for name, archives in by_name.items():
        archives.sort(key=lambda a: a.stat().st_mtime, reverse=True)
        for old in archives[KEEP_OLDER:]:
            key = old.name.removesuffix(".oci.tar").rsplit("-", 1)[1]
            ref = f"{REPO_PREFIX}/{name}:{key}"
            if name == "base":
                ref = f"{REPO_PREFIX}/base-python:{DEBIAN_SUITE}-{key}"
            subprocess.run(b.argv("rmi", ref), capture_output=True, check=False)
            old.unlink(missing_ok=True)
            if verbose:
                log(f"removed an older image archive and its image: {old.name}")


def ensure_pause_image(pause_binary: Path) -> Image:
    """The real nodes' sandbox image: our static Go pause binary alone (no registry to pull
    registry.k8s.io/pause from). Cached by the binary's digest."""
    require_tools("buildah")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(RECIPE.encode() + pause_binary.read_bytes()).hexdigest()[:12]
    ref = f"{REPO_PREFIX}/pause:{key}"
    img = Image("pause", ref, cache / f"pause-{key}.oci.tar")
    with locked(cache / ".lock"):
        if img.archive.is_file():
            return img
        b = Buildah(cache / "buildah")
        container = b("from", "scratch")
        try:
            b("copy", container, str(pause_binary), "/pause")
            b("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
            b("commit", "--quiet", container, ref, what=f"committing {ref}")
        finally:
            with contextlib.suppress(CliError):
                b("rm", container)
        push_archive(b, ref, img.archive)
        with contextlib.suppress(CliError):
            b("rmi", ref)
    return img


def cmd_images() -> None:
    images = ensure_images()
    for name in ("base", "operator", "trainer"):
        img = images[name]
        print(f"{name}_image={img.ref}")
        print(f"{name}_archive={img.archive}")


if __name__ == "__main__":  # for debugging: python3 imagebuild.py
    try:
        cmd_images()
    except CliError as e:
        print(f"images: error: {e}", file=sys.stderr)
        sys.exit(1)
