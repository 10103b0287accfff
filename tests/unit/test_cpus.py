"""A container's CPU limit, as the launcher shares it out between its ranks (megatron_contract/
cpus.py): the cgroup files of v1 and v2 as the kernel writes them, and this machine's own kernel
with a process in a cgroup of a real CFS quota."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from megatron_contract.cpus import cpu_limit, limited_cores


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


V1_POD = "/kubepods/burstable/pod1/abc"


@pytest.mark.parametrize(
    ("proc", "files", "cores"),
    [
        # cgroup v1, the cgroup named in /proc/self/cgroup (a host, or a cgroup namespace)
        (f"4:cpu,cpuacct:{V1_POD}\n0::/", {f"cpu,cpuacct{V1_POD}/cpu.cfs_quota_us": "800000",
         f"cpu,cpuacct{V1_POD}/cpu.cfs_period_us": "100000"}, 8.0),
        # v1 in a container without a cgroup namespace: the mount is the container's own cgroup
        (f"1:cpu:{V1_POD}", {"cpu/cpu.cfs_quota_us": "250000", "cpu/cpu.cfs_period_us": "100000"},
         2.5),
        # v1 without a limit
        (f"1:cpu:{V1_POD}", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
         None),
        # cgroup v2 in a container's namespace
        ("0::/", {"cpu.max": "400000 100000"}, 4.0),
        ("0::/kubepods/pod2/def", {"kubepods/pod2/def/cpu.max": "50000 100000"}, 0.5),
        ("0::/", {"cpu.max": "max 100000"}, None),
        # nothing readable, or not numbers: no limit rather than an error
        ("0::/", {}, None),
        ("", {}, None),
        ("0::/", {"cpu.max": "lots 100000"}, None),
        (f"1:cpu:{V1_POD}", {"cpu/cpu.cfs_quota_us": "0", "cpu/cpu.cfs_period_us": "0"}, None),
    ],
)  # fmt: skip
def test_the_limit_from_the_cgroup_files(
    tmp_path: Path, proc: str, files: dict[str, str], cores: float | None
) -> None:
    write(tmp_path / "fs", files)
    (tmp_path / "cgroup").write_text(proc + "\n" if proc else "")
    assert cpu_limit(tmp_path / "fs", tmp_path / "cgroup") == cores


def test_the_cores_shared_out_are_the_affinity_no_more_than_the_limit_rounded_up() -> None:
    assert limited_cores(96, 8.0) == 8
    assert limited_cores(96, 2.5) == 3
    assert limited_cores(96, 0.5) == 1
    assert limited_cores(4, 16.0) == 4  # the limit is above what the process may run on
    assert limited_cores(96, None) == 96
    assert limited_cores(0, None) == 1


CPU_V1 = Path("/sys/fs/cgroup/cpu")


def test_a_process_in_a_cgroup_with_a_quota_counts_the_limit_not_the_machine() -> None:
    """The kernel's own files: a child put into a fresh cgroup of one core's quota (as a pod
    limited to `cpu: 1` on this machine's kubelets) reads 1 core, while this process reads its
    affinity. cgroup v1 here (the machine mounts each controller); v2 hosts use cpu.max."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.is_file() and "cpu" in v2.read_text().split():
        group = Path("/sys/fs/cgroup") / f"megatron-test-{uuid.uuid4().hex[:8]}"
        group.mkdir()
        (group / "cpu.max").write_text("100000 100000")
    else:
        group = CPU_V1 / f"megatron-test-{uuid.uuid4().hex[:8]}"
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
    try:
        show = (
            "from megatron_contract.env import usable_cores;"
            "from megatron_contract.cpus import cpu_limit;"
            "print(usable_cores(), cpu_limit())"
        )
        join = f"import os; open('{group}/cgroup.procs', 'w').write(str(os.getpid()));"

        def run(code: str) -> list[str]:
            return subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
            ).stdout.split()

        assert run(join + show) == ["1", "1.0"]
        assert run(show) == [str(len(os.sched_getaffinity(0))), "None"]
    finally:
        group.rmdir()
