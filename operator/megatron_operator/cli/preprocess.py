"""The trainer's own tools, behind `mjob`: `preprocess` (jsonl → the indexed datasets the trainer
reads) and `export` (a job's checkpoint → a Hugging Face model). Their arguments belong to the
trainer's parsers, so everything after the sub-command's name is passed on untouched."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from megatron_operator.cli.common import CliError

# sub-command → (the trainer module whose main(argv) runs it, its help line)
TOOLS = {
    "preprocess": ("megatron_trainer.preprocess", "jsonl → .bin/.idx for training"),
    "export": ("megatron_trainer.export", "a job's checkpoint → a Hugging Face model"),
}


def _tool(name: str) -> Callable[[argparse.Namespace], int]:
    module_name = TOOLS[name][0]

    def run(args: argparse.Namespace) -> int:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise CliError(
                f"mjob {name} needs the trainer extra ({exc.name} is missing): "
                "pip install 'megatron-operator[trainer]'"
            ) from None
        rest: list[str] = args.rest
        return int(module.main(rest))

    return run


PASSTHROUGH = {name: _tool(name) for name in TOOLS}


def register(sub: Any) -> None:
    for name, (_, help_text) in TOOLS.items():
        p = sub.add_parser(name, help=f"{help_text} (see mjob {name} --help)", add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=PASSTHROUGH[name])
