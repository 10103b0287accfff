"""The CPU limit a container runs under: its cgroup's CFS quota, in cores.

A pod's `resources.limits.cpu` does not change the CPUs a process may run on (its affinity
still lists every core of the node); it caps the CPU time the kernel gives the container's
cgroup per period. A rank that starts a thread per core of a 96-core node in a pod limited to
8 cores is throttled for most of every period. The launcher shares out the smaller of the two
(env.usable_cores). Read from /proc/self/cgroup and the cgroup file system, cgroup v1 (the `cpu`
controller's cpu.cfs_quota_us and cpu.cfs_period_us) or v2 (cpu.max), stdlib only.
"""

from __future__ import annotations

import math
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _quota(quota: str, period: str) -> float | None:
    """Cores from a quota and a period in microseconds; None for no limit ("max", -1) or a
    value that is not one."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _candidates(mount: Path, path: str) -> list[Path]:
    """The process's cgroup directory under a hierarchy's mount, then the mount itself: inside
    a container the mount is often the container's own cgroup while /proc/self/cgroup still
    names the host's path (cgroup v1 without a cgroup namespace)."""
    own = mount / path.lstrip("/")
    return [own, mount] if own != mount else [mount]


def cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """This process's CPU limit in cores (fractional, as the quota is), or None without one."""
    lines = (_read(proc_cgroup) or "").splitlines()
    for line in lines:  # cgroup v1: "4:cpu,cpuacct:/kubepods/…"; a hybrid host has both
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpu" not in controllers.split(","):
            continue
        for mount in (root / controllers, root / "cpu"):
            for d in _candidates(mount, path):
                quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if quota is not None and period is not None:
                    return _quota(quota, period)
        return None
    for line in lines:  # cgroup v2: "0::/…"
        if line.startswith("0::"):
            for d in _candidates(root, line[3:]):
                text = _read(d / "cpu.max")
                if text is not None:
                    quota, _, period = text.partition(" ")
                    return _quota(quota, period or "100000")
    return None


def limited_cores(cores: int, limit: float | None) -> int:
    """The cores to share out: the affinity's count, no more than the limit rounded up (a limit
    of 2.5 cores keeps 3 threads busy part of the time rather than leave half a core idle)."""
    if limit is None:
        return max(1, cores)
    return max(1, min(cores, math.ceil(limit)))
