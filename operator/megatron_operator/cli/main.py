"""`mjob`: validate, plan and render MegatronJobs; run them locally; run the operator.

Errors go to stderr with a non-zero exit and never a traceback (unless MJOB_DEBUG=1):
exit 2 for an invalid spec or bad arguments, 1 for a failure while doing the work.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from megatron_operator.api import SpecError
from megatron_operator.cli import (
    goodput,
    launcher,
    operate,
    preprocess,
    profiles,
    run,
    spec,
    status,
)
from megatron_operator.cli.common import EXIT_INVALID, CliError


def package_version() -> str:
    try:
        return version("megatron-operator")
    except PackageNotFoundError:  # running from a source tree without an install
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mjob",
        description="MegatronJob tools: validate, plan, render, run, operate, status, logs, "
        "goodput, profiles.",
    )
    parser.add_argument("--version", action="version", version=f"mjob {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (spec, preprocess, operate, run, status, goodput, profiles, launcher):
        module.register(sub)
    return parser


def _print_spec_error(source: str, exc: SpecError) -> None:
    n = len(exc.errors)
    print(f"error: {source} is invalid ({n} problem{'s' if n != 1 else ''}):", file=sys.stderr)
    for err in exc.errors:
        print(f"  - {err}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = preprocess.PASSTHROUGH.get(argv[0]) if argv else None
    if command is not None:
        # Everything after the word belongs to the trainer's own parser (--help included):
        # argparse's REMAINDER cannot pass on leading options.
        return _guard(lambda: command(argparse.Namespace(rest=argv[1:])), None)
    parser = build_parser()
    args = parser.parse_args(argv)
    return _guard(lambda: int(args.func(args)), getattr(args, "file", None))


def _guard(run_command: Callable[[], int], source: str | None) -> int:
    """Run a command, turning every expected failure into a message and an exit code."""
    try:
        return run_command()
    except SpecError as exc:
        _print_spec_error(source or "the spec", exc)
        return EXIT_INVALID
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("MJOB_DEBUG") == "1":
            raise
        print(
            f"internal error: {type(exc).__name__}: {exc} (set MJOB_DEBUG=1 for a traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
