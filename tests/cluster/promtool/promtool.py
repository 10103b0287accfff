"""`cluster promtool` (tests/cluster/cluster): Prometheus's promtool, for `promtool test rules` over the chart's alerts.

Built from its Go module like every other tool here (pinned in VERSION, next to this file), into
a cache directory of its own: ~/.cache/megatron-operator/promtool/<version>/promtool. It is not
part of `cluster build`, so the control plane's cache key and cold build are unchanged; the first
test that needs it builds it (about 10 minutes cold on 2 cores), later ones reuse it. A promtool
already on PATH (e.g. Debian's `prometheus` package, promtool 2.42) is used as it is.

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


def ensure() -> Path:
    """The promtool binary: on PATH, cached, or built now."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    binary = cache_dir() / "promtool"
    if os.access(binary, os.X_OK):
        return binary
    if shutil.which("go") is None:
        sys.exit("promtool needs Go to build (or `apt-get install prometheus` for Debian's)")
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
