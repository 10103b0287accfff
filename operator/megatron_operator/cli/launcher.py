"""`mjob launcher build|install DEST`: the launcher zipapp (megatron_operator/zipapp.py).

`build` makes it from the installed sources (Dockerfile.operator keeps one in the operator
image); `install` is the command of a trainer.command pod's init container: it copies the
image's copy into the pod's launcher volume (or builds one where the image has none).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from pathlib import Path
from typing import Any

from megatron_contract.paths import LAUNCHER_IN_OPERATOR_IMAGE
from megatron_operator import zipapp
from megatron_operator.cli.common import CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "launcher",
        help="build the launcher zipapp a trainer.command pod runs with its image's python3",
    )
    p.add_argument("action", choices=("build", "install"), help="build it, or install a copy")
    p.add_argument("dest", help="where to write it (e.g. /opt/megatron-launcher/launcher.pyz)")
    p.set_defaults(func=cmd_launcher)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("megatron-operator")
    except PackageNotFoundError:  # a source tree without an install
        return "unknown"


def cmd_launcher(args: argparse.Namespace) -> int:
    dest = Path(args.dest)
    built = Path(LAUNCHER_IN_OPERATOR_IMAGE)
    try:
        if args.action == "install" and built.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.tmp")
            shutil.copyfile(built, tmp)
            tmp.chmod(0o755)
            tmp.replace(dest)
            digest = hashlib.sha256(dest.read_bytes()).hexdigest()
        else:
            digest = zipapp.build(dest, _version())
    except OSError as err:
        raise CliError(f"cannot write the launcher to {dest}: {err}") from err
    print(f"launcher {_version()} at {dest} (sha256 {digest})")
    return 0
