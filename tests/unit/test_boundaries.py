"""Import boundaries: the pure core imports neither kopf nor a Kubernetes client, and the trainer
never imports the operator. Checked by static analysis of the import graph (import-linter's
contracts in pyproject.toml) and, independently, by importing the core in a clean interpreter."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = [
    "megatron_operator.api",
    "megatron_operator.core.planner",
    "megatron_operator.core.render",
    "megatron_operator.core.resolve",
    "megatron_operator.core.memory",
    "megatron_operator.core.trainer_config",
    "megatron_operator.core.reconcile",
    "megatron_operator.core.kueue",
]


def test_import_linter_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("lint-imports is missing: install the dev extra")
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" not in proc.stdout.lower() or " 0 broken" in proc.stdout


def test_core_loads_without_kopf_or_kubernetes() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in CORE)
        + "bad = [m for m in ('kopf', 'kubernetes', 'megatron_trainer', 'torch') if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        "megatron_contract", "megatron_operator", "megatron_trainer", include_external_packages=True
    )


def _cycles(graph: grimp.ImportGraph, package: str) -> list[tuple[str, ...]]:
    """Import cycles among the modules of `package` (Tarjan's strongly connected components)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            # A package's __init__ importing its own modules is not a cycle of ours.
            real = [m for m in component if not any(o.startswith(m + ".") for o in component)]
            if len(real) > 1:
                found.append(tuple(sorted(component)))

    for m in modules:
        if m not in index:
            visit(m)
    return found


@pytest.mark.parametrize("package", ["megatron_contract", "megatron_operator", "megatron_trainer"])
def test_no_import_cycles(package: str) -> None:
    assert _cycles(_graph(), package) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check above can fail: an import added from common back to main is reported."""
    graph = _graph()
    graph.add_import(
        importer="megatron_operator.cli.common",
        imported="megatron_operator.cli.main",
        line_number=1,
        line_contents="from megatron_operator.cli.main import main",
    )
    cycles = _cycles(graph, "megatron_operator")
    assert any(
        "megatron_operator.cli.common" in c and "megatron_operator.cli.main" in c for c in cycles
    )


def test_the_contract_is_standard_library_only() -> None:
    graph = _graph()
    outside = set()
    for module in graph.modules:
        if not module.startswith("megatron_contract"):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            top = imported.split(".")[0]
            if top != "megatron_contract" and top not in sys.stdlib_module_names:
                outside.add(f"{module} -> {imported}")
    assert outside == set()


def test_validate_does_not_load_the_state_machine() -> None:
    code = (
        "import sys\n"
        "from megatron_operator.cli.main import main\n"
        "code = main(['validate', 'examples/cpu-tiny.yaml'])\n"
        "loaded = [m for m in ('megatron_operator.core.reconcile', 'kopf', 'kubernetes') "
        "if m in sys.modules]\n"
        "print(code, ','.join(loaded))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split("\n")[-2] == "0 "
