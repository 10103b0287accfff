"""`mjob preprocess`: jsonl → the indexed datasets the trainer reads (the trainer's own tool)."""

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


def register(sub: Any) -> None:
    p = sub.add_parser(
        "preprocess",
        help="jsonl → .bin/.idx for training (see mjob preprocess --help)",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_preprocess)
