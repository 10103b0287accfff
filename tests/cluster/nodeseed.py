"""One unpacked image store shared by every real node, made once per set of images.

Importing the OCI archives into each node's containerd unpacked the same ~6 GB three times at
every `up --real-nodes 3` (350-480 s on 2 cores, nearly all of a cluster start). Here the
archives are imported once into a seed: a containerd root directory, cached under
~/.cache/megatron-operator/node-seeds/ and keyed by the archives (their names carry a digest of
their content) and containerd's version. Each node's root is then a hard-linked copy of the seed
(`cp -al`: a second or two), with containerd's bolt databases copied for real, since they are
the only files containerd writes in place.

Why sharing the unpacked layers is safe: the files of a committed snapshot are only ever an
overlay's lower layer, which overlayfs never writes (a container's writes go to its own upper
directory, created per node); content blobs are immutable and addressed by digest. Removing a
node's root (teardown) unlinks names, not the seed's files.

A new set of images (a commit changed the trainer's code) starts from a copy of the newest seed,
so only the layers that changed are unpacked; images of the old set are then removed from the
new seed and containerd's garbage collector drops their layers.

Python standard library only; needs `containerd` and `ctr` (Debian's containerd package).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from common import die, log

# Bump when the way a seed is made changes, to invalidate cached seeds.
RECIPE = "1"
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin reads
SNAPSHOTTER = "overlayfs"  # must be the nodes' CRI snapshotter (realnodes.containerd_config)
KEEP_OLDER = 1  # seeds kept besides the newest (another checkout may still use it)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megatron-operator" / "node-seeds"


def containerd_version() -> str:
    proc = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "unknown"


def seed_key(images: Mapping[str, Path]) -> str:
    h = hashlib.sha256(f"{RECIPE}|{SNAPSHOTTER}|{containerd_version()}".encode())
    for ref, archive in sorted(images.items()):
        h.update(f"|{ref}={archive.name}:{archive.stat().st_size}".encode())
    return h.hexdigest()[:12]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another node seed build holding {path}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def clone_root(seed: Path, dest: Path) -> None:
    """`dest` becomes a containerd root with the seed's images: hard links to the seed's files,
    real copies of its databases (containerd rewrites those in place)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(seed), str(dest)], check=True)
    for db in seed.rglob("*.db"):
        copy = dest / db.relative_to(seed)
        copy.unlink()
        shutil.copy2(db, copy)


def _ctr(socket: Path, *args: str) -> list[str]:
    return ["ctr", "--address", str(socket), "-n", NAMESPACE, *args]


def _run(argv: Sequence[str], what: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        die(
            f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-2000:]}"
        )
    return proc.stdout


def _import(work: Path, images: Mapping[str, Path]) -> None:
    """Import the archives into the containerd root work/root with a containerd of our own
    (no CRI plugin: nothing but the image store), then drop every image not in this set."""
    socket = work / "c.sock"
    config = work / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{work / "root"}"\n'
        f'state = "{work / "state"}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{socket}"\n'
        f'[ttrpc]\n  address = "{work / "c.ttrpc.sock"}"\n'
    )
    logf = (work / "containerd.log").open("ab")
    proc = subprocess.Popen(
        ["containerd", "--config", str(config)], stdout=logf, stderr=subprocess.STDOUT
    )
    logf.close()
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(_ctr(socket, "version"), capture_output=True, check=False).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                die(f"the seed's containerd did not start; see {work / 'containerd.log'}")
            time.sleep(0.2)
        for archive in images.values():
            _run(
                _ctr(
                    socket,
                    "images",
                    "import",
                    "--all-platforms",
                    "--snapshotter",
                    SNAPSHOTTER,
                    str(archive),
                ),
                f"importing {archive.name} into the node seed",
            )
        listed = _run(_ctr(socket, "images", "ls", "-q"), "listing the seed's images").split()
        missing = sorted(set(images) - set(listed))
        if missing:
            die(f"the node seed lacks {', '.join(missing)} after importing its archives")
        stale = [ref for ref in listed if ref not in images]
        if stale:
            _run(_ctr(socket, "images", "rm", "--sync", *stale), "removing older images")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(work / "state", ignore_errors=True)


def seeded_root(images: Mapping[str, Path]) -> Path:
    """The seed's containerd root holding these images ({ref: OCI archive}), made if missing;
    returns its path."""
    cache = cache_dir()
    key = seed_key(images)
    seed = cache / key
    with _locked(cache / ".lock"):
        if (seed / "done").is_file():
            os.utime(seed / "done")  # newest use first when pruning
            return seed / "root"
        t = time.monotonic()
        older = sorted(
            (d for d in cache.iterdir() if (d / "done").is_file()),
            key=lambda d: (d / "done").stat().st_mtime,
            reverse=True,
        )
        work = cache / f"tmp-{key}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if older:
            clone_root(older[0] / "root", work / "root")
        _import(work, images)
        (work / "done").write_text(f"{key}\n")
        shutil.rmtree(seed, ignore_errors=True)
        work.rename(seed)
        for old in older[KEEP_OLDER:]:
            shutil.rmtree(old, ignore_errors=True)
        how = f"from {older[0].name}" if older else "from nothing"
        log(f"node seed {key} made {how} in {time.monotonic() - t:.0f} s")
    return seed / "root"
