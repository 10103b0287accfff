"""The trainer's own tools, behind `mjob`: `preprocess` (jsonl → the indexed datasets the trainer
reads) and `export` (a job's checkpoint → a Hugging Face model). Their arguments belong to the
trainer's parsers, so everything after the sub-command's name is passed on untouched."""

from __future__ import annotations

import argparse
from typing import Any

from megatron_operator.cli.common import CliError


def cmd_preprocess(args: argparse.Namespace) -> int:
    try:
        from megatron_trainer.preprocess import main as preprocess_main
    except ImportError as exc:
        raise CliError(
            f"mjob preprocess needs the trainer extra ({exc.name} is missing): "
            "pip install 'megatron-operator[trainer]'"
        ) from None
    rest: list[str] = args.rest
    return int(preprocess_main(rest))


def cmd_export(args: argparse.Namespace) -> int:
    try:
        from megatron_trainer.export import main as export_main
    except ImportError as exc:
        raise CliError(
            f"mjob export needs the trainer extra ({exc.name} is missing): "
            "pip install 'megatron-operator[trainer]'"
        ) from None
    rest: list[str] = args.rest
    return int(export_main(rest))


# The sub-commands whose arguments go to the trainer's own parser, by name.
PASSTHROUGH = {"preprocess": cmd_preprocess, "export": cmd_export}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preprocess",
        help="jsonl → .bin/.idx for training (see mjob preprocess --help)",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_preprocess)
    p = sub.add_parser(
        "export",
        help="a job's checkpoint → a Hugging Face model (see mjob export --help)",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_export)
