"""The launcher zipapp (megatron_operator/zipapp.py): what a trainer.command pod runs with its
image's own python3, which may be any Python from 3.8 to 3.13.

- statically, every module in it parses as Python 3.8, uses nothing of the standard library
  newer than 3.8 (vermin), and nothing newer at run time that vermin cannot see (a builtin's
  `X[...]` or a type's `X | Y` outside annotations, annotations evaluated without
  `from __future__ import annotations`); pyproject.toml holds those files to ruff's py38;
- the build is reproducible, and the zipapp imports its own modules, not the installed ones;
- for real, under Debian bullseye's Python 3.9 and trixie's 3.13 (chroots made once and cached,
  tests/cluster/imagebuild.py `python_root`): `--version`, and one InPlace launch of a two-rank
  command whose stand-in ranks print Megatron-LM's log lines, which become the job's progress.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from megatron_contract.paths import LAUNCHER_ZIPAPP
from megatron_operator import zipapp
from megatron_operator.api import load_job
from megatron_operator.core.planner import plan
from megatron_operator.core.render import config_map, pod

from .specs import job_doc

ROOT = Path(__file__).resolve().parents[2]

# `X[...]` of these at run time needs 3.9; `X | Y` of types needs 3.10.
_GENERICS = {
    "dict", "list", "tuple", "set", "frozenset", "type", "Callable", "Mapping", "Sequence",
    "Iterator", "Iterable", "MutableMapping", "Set", "Generator", "Collection", "Container",
    "MutableSequence", "MutableSet", "deque", "defaultdict", "OrderedDict", "Counter", "Pattern",
}  # fmt: skip
_TYPES = {"int", "float", "str", "bytes", "bool", "dict", "list", "tuple", "set", "object"}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def runtime_problems(source: bytes, path: str) -> list[str]:
    """What Python 3.8 would refuse at run time in `source` (parsed as 3.8 syntax)."""
    tree = ast.parse(source, path, feature_version=(3, 8))
    problems: list[str] = []
    annotations: set[int] = set()
    has_annotations = False
    for n in ast.walk(tree):
        found = []
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            a = n.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            found = [n.returns, *(x.annotation for x in args if x is not None)]
        elif isinstance(n, ast.AnnAssign):
            found = [n.annotation]
        for node in found:
            if node is not None:
                annotations.add(id(node))
                has_annotations = True
    future = any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    )
    if has_annotations and not future:
        problems.append(f"{path}: annotations without `from __future__ import annotations`")

    def visit(n: ast.AST) -> None:
        if id(n) in annotations:
            return
        if isinstance(n, ast.If) and _name(n.test) == "TYPE_CHECKING":
            return  # never runs
        if isinstance(n, ast.Subscript) and _name(n.value) in _GENERICS:
            problems.append(f"{path}:{n.lineno}: {_name(n.value)}[...] at run time (3.9+)")
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
            for side in (n.left, n.right):
                none = isinstance(side, ast.Constant) and side.value is None
                if none or _name(side) in _TYPES or isinstance(side, ast.Subscript):
                    problems.append(f"{path}:{n.lineno}: `X | Y` of types at run time (3.10+)")
                    break
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(tree)
    return problems


def test_every_module_of_the_zipapp_runs_on_python_3_8() -> None:
    files = zipapp.modules()
    assert "megatron_trainer.launcher" in files and "megatron_trainer.agent.coordinator" in files
    # Nothing heavy: the launcher is stdlib only (the trainer's torch code stays out).
    assert not {"megatron_trainer.worker", "megatron_trainer.loop", "megatron_trainer.model"} & set(
        files
    )
    problems = []
    for name, path in files.items():
        problems += runtime_problems(path.read_bytes(), f"{name} ({path.name})")
    assert problems == []
    vermin = subprocess.run(
        [str(Path(sys.executable).with_name("vermin")), "-t=3.8-", "--no-tips", "--violations"]
        + [str(p) for p in files.values()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert vermin.returncode == 0, vermin.stdout + vermin.stderr


def test_the_checker_catches_what_3_8_refuses() -> None:
    bad = b"from typing import Any\nA = dict[str, Any]\nB = int | None\n"
    assert len(runtime_problems(bad, "x")) == 2
    assert runtime_problems(b"def f(x: list[int]) -> None: ...\n", "y")  # no __future__
    ok = b"from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
    ok += b"if TYPE_CHECKING:\n    A = dict[str, int]\ndef f(x: int | None) -> list[int]: ...\n"
    ok += b"flags = 1 | 2\n"
    assert runtime_problems(ok, "z") == []


def test_ruff_holds_every_zipapp_module_to_python_3_8() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["ruff"]["per-file-target-version"]
    py38 = [Path(p) for p, v in patterns.items() if v == "py38"]
    for name, path in zipapp.modules().items():
        rel = path.resolve().relative_to(ROOT)
        assert any(rel.match(str(p)) for p in py38), f"{name}: add {rel} to pyproject's py38 list"


def test_the_build_is_reproducible_and_imports_its_own_modules(tmp_path: Path) -> None:
    first = zipapp.build_bytes("1.2.3")
    assert zipapp.build_bytes("1.2.3") == first
    target = tmp_path / "launcher.pyz"
    zipapp.build(target, "1.2.3")
    assert target.read_bytes() == first and os.access(target, os.X_OK)
    out = subprocess.run(
        [sys.executable, str(target), "--version"], capture_output=True, text=True, check=False
    )
    assert out.stdout.strip() == "megatron_trainer 1.2.3", out
    names = sorted(zipapp.modules())
    code = (
        f"import importlib, sys; sys.path.insert(0, {str(target)!r}); "
        f"mods = [importlib.import_module(n) for n in {names!r}]; "
        f"print(all(m.__file__.startswith({str(target)!r}) for m in mods))"
    )
    imported = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=False
    )
    assert imported.stdout.strip() == "True", imported.stderr


# A stand-in rank, stdlib only: the last rank prints Megatron-LM's training log lines, rank 0
# its checkpoint line (the formats of megatron/training/training.py and checkpointing.py).
STAND_IN = """
import os, sys
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
for it in (1, 2, 3):
    if rank == world - 1:
        print(f" [2026-11-02 10:00:0{it}.000000] iteration {it:8d}/{3:8d} | consumed samples: "
              f"{it * 8:12d} | elapsed time per iteration (ms): 12.5 | learning rate: "
              f"1.000000E-04 | global batch size:     8 | lm loss: {4.0 / it:.6E} | loss scale: "
              f"1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan "
              f"iterations:   0 |", flush=True)
if rank == 0:
    print("  [2026-11-02 10:00:03.500000] successfully saved checkpoint from iteration       3 "
          "to /ckpt [ t 1/1, p 1/1 ]", flush=True)
print(f"stand-in rank {rank} python {sys.version_info[0]}.{sys.version_info[1]}", flush=True)
"""


def _pod_setup(root: Path, work: str) -> dict[str, str]:
    """The rendered pod's env and config for a one-pod, two-rank command job, with paths inside
    the chroot (`work` is a directory of it)."""
    spec = {
        "image": "debian:any",
        "trainer": {"command": ["python3", "-c", STAND_IN]},
        "resources": {"nodes": 1, "procsPerNode": 2, "accelerator": "none"},
        "checkpoint": {"volume": {"claimName": "ckpt"}},
    }
    job = load_job(job_doc(spec, name="py"))
    p = plan(job.spec)
    config = json.loads(config_map(job, p)["data"]["config.json"])
    config["checkpoint"]["dir"] = f"{work}/ckpt"
    (root / work.lstrip("/") / "config.json").write_text(json.dumps(config))
    rendered = pod(job, p, 0, 0)
    container = rendered["spec"]["containers"][0]
    assert container["command"] == ["python3", LAUNCHER_ZIPAPP]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.update(
        PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        MASTER_ADDR="127.0.0.1",
        POD_NAME="py-a0-0",
        POD_NAMESPACE="default",
        MEGATRON_CONFIG=f"{work}/config.json",
        MEGATRON_PROGRESS_FILE=f"{work}/progress.jsonl",
        MEGATRON_STATUS_FILE=f"{work}/status.json",
        MEGATRON_REPORT_FILE=f"{work}/launchers.json",
        MEGATRON_COORDINATOR_KEY_FILE=f"{work}/coordinator.key",
    )
    key = root / work.lstrip("/") / "coordinator.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    (root / work.lstrip("/") / "status.json").write_text(
        json.dumps({"restartAttempt": 0, "phase": "Running"})
    )
    return env


@pytest.mark.parametrize("suite", ["bullseye", "trixie"])
def test_the_launcher_runs_a_command_job_under_other_pythons(suite: str, tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("needs root and unshare (chroot into a Debian root with its python3)")
    sys.path.insert(0, str(ROOT / "tests" / "cluster"))
    try:
        import imagebuild
    finally:
        sys.path.pop(0)
    root = imagebuild.python_root(suite)
    work = f"/tmp/launcher-{uuid.uuid4().hex[:8]}"
    (root / work.lstrip("/")).mkdir(parents=True)
    try:
        zipapp.build(root / work.lstrip("/") / "launcher.pyz", "9.9.9")
        env = _pod_setup(root, work)
        # A mount namespace with its own /proc (the launcher reads it to find its descendants).
        chroot = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc"]
        chroot += ["chroot", str(root), "python3", f"{work}/launcher.pyz"]
        version = subprocess.run(
            [*chroot, "--version"], capture_output=True, text=True, env=env, check=False
        )
        assert version.stdout.strip() == "megatron_trainer 9.9.9", version
        run = subprocess.run(
            chroot, capture_output=True, text=True, env=env, timeout=120, check=False
        )
        out = run.stdout + run.stderr
        assert run.returncode == 0, out
        want = imagebuild.PYTHON_SUITES[suite]
        assert f"stand-in rank 0 python {want}" in out and f"stand-in rank 1 python {want}" in out
        assert "iteration        3/       3 | consumed samples" in out  # copied to the log as is
        # In place: the coordinator (HMAC handshake) and the agent ran under this Python.
        assert "coordinating 1 launcher(s)" in out and "started the ranks of attempt 0" in out
        records = [
            json.loads(line)
            for line in (root / work.lstrip("/") / "progress.jsonl").read_text().splitlines()
        ]
        steps = [(r["iteration"], r["loss"], r["attempt"]) for r in records]
        assert steps == [(1, 4.0, 0), (2, 2.0, 0), (3, pytest.approx(4 / 3), 0)], records
        assert records[-1]["checkpointIteration"] in (None, 3)  # rank 0's line may come later
    finally:
        shutil.rmtree(root / work.lstrip("/"), ignore_errors=True)
