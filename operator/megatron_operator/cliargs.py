"""Arguments shared by several `mjob` sub-commands."""

from __future__ import annotations

import argparse


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """FILE and the repeatable `--set path=value` override."""
    p.add_argument("file", help="MegatronJob YAML file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field, e.g. training.trainIters=1000 (repeatable; relative to spec)",
    )
