"""The launcher as one file: a standard-library zipapp that runs with a training image's python3.

A MegatronJob with `spec.trainer.command` runs the user's image unchanged: an init container
from the operator's own image copies this file into an emptyDir volume of the pod
(`megatron_contract.paths.LAUNCHER_*`, core/render.py), and the trainer container runs it with
the image's own `python3` (3.8 to 3.13). It holds `megatron_trainer.launcher`, everything that
module imports of ours (the in-place agent and coordinator, the progress readers, the contract
modules), and a `__main__` that calls it; nothing else of the trainer and no third-party code.

Built reproducibly: the same sources give the same bytes (sorted entries, a fixed timestamp and
mode, no bytecode). The operator image builds it (`mjob launcher build`, Dockerfile.operator),
`mjob run --local` builds it into its work directory, and tests/unit/test_launcher_zipapp.py checks
that every module in it parses as Python 3.8 and uses nothing newer.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import os
import zipfile
from pathlib import Path

ENTRY = "megatron_trainer.launcher"
PACKAGES = ("megatron_trainer", "megatron_contract")
MAIN = (
    "import sys\n"
    "if sys.version_info < (3, 8):\n"
    '    sys.exit("megatron launcher: Python 3.8 or newer is needed, this is " + sys.version)\n'
    "from megatron_trainer.early_signals import catch\n"
    "catch()\n"
    "from megatron_trainer.launcher import main\n"
    "sys.exit(main())\n"
)
VERSION_MODULE = "megatron_trainer/_build.py"
_STAMP = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no build time in the bytes


def package_dir(package: str) -> Path:
    """Where an installed (or source-tree) package's files are, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package} is not installed here")
    return Path(next(iter(spec.submodule_search_locations)))


def _module_file(name: str) -> Path | None:
    top, _, rest = name.partition(".")
    if top not in PACKAGES:
        return None
    base = package_dir(top).joinpath(*rest.split(".")) if rest else package_dir(top)
    if base.is_dir():
        return base / "__init__.py"
    file = base.with_suffix(".py")
    return file if file.is_file() else None


def _imports(name: str, file: Path) -> set[str]:
    """The modules of ours `file` (module `name`) imports, anywhere in it (lazy imports too)."""
    tree = ast.parse(file.read_bytes(), str(file))
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            # `from . import profilers` names a module; `from .x import y` may name one too.
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m.partition(".")[0] in PACKAGES and _module_file(m)}


def modules(entry: str = ENTRY) -> dict[str, Path]:
    """Every module of ours the entry needs, with its parent packages: {dotted name: file}."""
    todo, found = [entry], {}
    while todo:
        name = todo.pop()
        if name in found:
            continue
        file = _module_file(name)
        if file is None:
            continue
        found[name] = file
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages
        todo += sorted(_imports(name, file))
    return found


def _entry_path(name: str, file: Path) -> str:
    path = name.replace(".", "/")
    return f"{path}/__init__.py" if file.name == "__init__.py" else f"{path}.py"


def build_bytes(version: str) -> bytes:
    """The zipapp's bytes: the same sources and version always give the same bytes."""
    entries = {_entry_path(n, f): f.read_bytes() for n, f in modules().items()}
    entries[VERSION_MODULE] = (
        f'"""Written by megatron_operator.zipapp."""\n\nVERSION = {version!r}\n'.encode()
    )
    entries["__main__.py"] = MAIN.encode()
    out = io.BytesIO()
    out.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(entries):
            info = zipfile.ZipInfo(path, _STAMP)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, entries[path], compresslevel=9)
    return out.getvalue()


def build(dest: str | os.PathLike[str], version: str) -> str:
    """Write the zipapp to `dest` (atomically, mode 0755); its sha256."""
    data = build_bytes(version)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(dest)
    return hashlib.sha256(data).hexdigest()
