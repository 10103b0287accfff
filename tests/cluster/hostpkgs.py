"""The Debian packages real nodes and image builds need, installed by `cluster build
--real-nodes` when missing (as root, with apt-get), so that a new machine needs nothing by hand.

Python standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from common import die, log

# What must be found -> the Debian package that provides it.
REAL_NODES: dict[str, str] = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "buildah": "buildah",
    "mmdebstrap": "mmdebstrap",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
    "/usr/lib/cni/host-local": "containernetworking-plugins",
    "ip": "iproute2",
    "nsenter": "util-linux",
}


def missing(wanted: dict[str, str]) -> list[str]:
    """The packages of what is not found, in order, each once."""
    out: list[str] = []
    for thing, package in wanted.items():
        found = Path(thing).exists() if thing.startswith("/") else shutil.which(thing) is not None
        if not found and package not in out:
            out.append(package)
    return out


def ensure(wanted: dict[str, str]) -> None:
    packages = missing(wanted)
    if not packages:
        return
    command = f"apt-get install -y {' '.join(packages)}"
    if os.geteuid() != 0:
        die(f"real nodes need Debian packages that are not installed; as root: {command}")
    if shutil.which("apt-get") is None:
        die(f"real nodes need {', '.join(packages)}, and there is no apt-get to install them")
    t = time.monotonic()
    log(f"installing {', '.join(packages)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    argv = ["apt-get", "install", "-y", "-q", *packages]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:  # a new machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=False)
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        die(f"`{command}` failed (exit {proc.returncode}):\n{proc.stderr.strip()[-3000:]}")
    still = missing(wanted)
    if still:
        die(f"installed {', '.join(packages)}, but still missing: {', '.join(still)}")
    log(f"installed {', '.join(packages)} in {time.monotonic() - t:.0f} s")
