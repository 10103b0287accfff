"""`cluster promtool` (tests/cluster/cluster): Prometheus's promtool, for `promtool test rules` over
the chart's alerts. It is not part of `cluster build`: the control plane's cache key and cold
build are unchanged, and the first test that needs it fetches it. In order:

1. a promtool on PATH, as it is;
2. one fetched or built before, from ~/.cache/megatron-operator/promtool/;
3. Debian's: `apt-get download prometheus` (the ordinary client; nothing is installed) and its
   /usr/bin/promtool taken out of the .deb with `dpkg-deb -x` (promtool 2.42 on bookworm: 45 s
   on a machine that never fetched it, most of it the 30 MB download; `apt-get update` first
   when the package lists are missing, as root);
4. else built from its Go module at the version in VERSION (next to this file), as every other
   tool here is built. It brings most of Prometheus's service-discovery dependencies (cloud SDKs
   among them): about an hour of a 2-core machine under the load of parallel builds.

`promtool test rules` has read the same test files since Prometheus 2.x; tests/unit/
test_alert_rules.py passes with both (2.42 and v0.316.0).

Python standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = "github.com/prometheus/prometheus"


def version() -> str:
    return (HERE / "VERSION").read_text().strip()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "megatron-operator" / "promtool" / version()


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def debian_dir() -> Path:
    return cache_dir().parent / "debian"


def _download(cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "download", "prometheus"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def from_debian() -> Path | None:
    """Debian's promtool out of its package (no install), or None where apt cannot fetch it."""
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        return None
    binary = debian_dir() / "promtool"
    with _lock(cache_dir().parent / ".build.lock"):
        if os.access(binary, os.X_OK):
            return binary
        with tempfile.TemporaryDirectory() as tmp:
            got = _download(tmp)
            if got.returncode != 0 and os.geteuid() == 0:
                # A new machine may have no package lists yet (as hostpkgs.py does for the
                # real nodes' packages): fetch them once, then try again.
                subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False)
                got = _download(tmp)
            debs = sorted(Path(tmp).glob("prometheus_*.deb"))
            if got.returncode != 0 or not debs:
                print(f"apt-get download prometheus failed: {got.stderr[-500:]}", file=sys.stderr)
                return None
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), f"{tmp}/x"], check=True)
            debian_dir().mkdir(parents=True, exist_ok=True)
            shutil.copy2(f"{tmp}/x/usr/bin/promtool", binary)
            (debian_dir() / "PACKAGE").write_text(debs[0].name + "\n")
    return binary


def ensure() -> Path:
    """The promtool binary: on PATH, cached, Debian's, or built now."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    binary = cache_dir() / "promtool"
    for cached in (binary, debian_dir() / "promtool"):
        if os.access(cached, os.X_OK):
            return cached
    debian = from_debian()
    if debian is not None:
        return debian
    if shutil.which("go") is None:
        sys.exit("promtool: neither apt-get (Debian's package) nor go (its Go module) is here")
    with _lock(cache_dir().parent / ".build.lock"):
        if os.access(binary, os.X_OK):
            return binary
        tmp = cache_dir().with_name(cache_dir().name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOBIN": str(tmp)}
        started = time.monotonic()
        print(f"building promtool {version()} (once; cached in {cache_dir()})", file=sys.stderr)
        proc = subprocess.run(
            [
                "go", "install", "-trimpath", "-ldflags", "-s -w",
                f"{MODULE}/cmd/promtool@{version()}",
            ],
            cwd=tempfile.gettempdir(),
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"building promtool failed:\n{proc.stderr[-4000:]}")
        shutil.rmtree(cache_dir(), ignore_errors=True)
        tmp.rename(cache_dir())
        print(f"built promtool in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return binary


def main() -> None:
    print(f"promtool={ensure()}")


if __name__ == "__main__":
    main()
