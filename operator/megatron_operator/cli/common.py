"""What every `mjob` sub-command shares: the spec arguments, the error type, output formats.

Sub-commands import this module and the layers below (api, core, local), never each other or
`main`: the parser in `main` is the only place that knows them all.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from megatron_operator.api import load_file
from megatron_operator.api.job import MegatronJob
from megatron_operator.cli.yamlio import dump_yaml
from megatron_operator.core.planner import Plan, plan

EXIT_INVALID = 2  # an invalid spec or bad arguments
EXIT_FAILED = 1  # a failure while doing the work


class CliError(Exception):
    """A user-facing failure: printed as one message, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


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


def load_and_plan(path: str, overrides: list[str]) -> tuple[MegatronJob, Plan]:
    """Load a spec and plan it; every spec problem becomes a SpecError naming the fields."""
    job = load_file(path, overrides)
    return job, plan(job.spec)


def dump(obj: Any, fmt: str) -> str:
    """`json` or `yaml` text of a document, ending in a newline."""
    if fmt == "json":
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    return dump_yaml(obj)
