"""`mjob`: validate, plan and render MegatronJobs; run them locally; run the operator.

Errors go to stderr with a non-zero exit and never a traceback (unless MJOB_DEBUG=1):
exit 2 for an invalid spec or bad arguments, 1 for a failure while doing the work.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import operator_cli
from .api import SpecError, load_file
from .api.job import MegatronJob
from .cliargs import add_spec_args
from .layout import Plan, plan
from .local import cli as local_cli
from .yamlio import dump_yaml

EXIT_INVALID = 2


class CliError(Exception):
    """A user-facing failure: printed as one message, exit code attached."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    return dump_yaml(obj)


def load_and_plan(path: str, overrides: list[str]) -> tuple[MegatronJob, Plan]:
    """Load a spec and plan it; every spec problem becomes a SpecError naming the fields."""
    job = load_file(path, overrides)
    return job, plan(job.spec)


def cmd_validate(args: argparse.Namespace) -> int:
    job, p = load_and_plan(args.file, args.overrides)
    print(
        f"{args.file}: MegatronJob {job.name} is valid: {p.layout_string()} on {p.nodes} × "
        f"{p.procs_per_node} ({p.world_size} ranks), ~{p.memory.per_gpu_gib:.1f} GiB per GPU"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    _, p = load_and_plan(args.file, args.overrides)
    if args.output == "table":
        from .plan_table import print_plan

        print_plan(p, max_nodes=args.max_nodes)
    else:
        sys.stdout.write(_dump(p.to_dict(), args.output))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from .render import as_list, render

    if args.restart_attempt < 0:
        raise CliError("--restart-attempt must be 0 or more", EXIT_INVALID)
    job, p = load_and_plan(args.file, args.overrides)
    sys.stdout.write(_dump(as_list(render(job, p, args.restart_attempt)), args.output))
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from .gen import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mjob", description="MegatronJob tools: validate, plan, render, run, operate."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a spec; exit 2 with every problem")
    add_spec_args(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the rank→node plan and memory estimate")
    add_spec_args(p)
    p.add_argument("-o", "--output", choices=["json", "yaml", "table"], default="table")
    p.add_argument("--max-nodes", type=int, default=16, help="nodes shown in the table")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("render", help="print the Kubernetes objects the operator creates")
    add_spec_args(p)
    p.add_argument("--restart-attempt", type=int, default=0, metavar="N")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("crd", help="print the MegatronJob CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser(
        "preprocess",
        help="jsonl → .bin/.idx for training (see mjob preprocess --help)",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_preprocess)

    operator_cli.register(sub)
    local_cli.register(sub)
    return parser


def _print_spec_error(source: str, exc: SpecError) -> None:
    n = len(exc.errors)
    print(f"error: {source} is invalid ({n} problem{'s' if n != 1 else ''}):", file=sys.stderr)
    for err in exc.errors:
        print(f"  - {err}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["preprocess"]:
        # Everything after the word belongs to the trainer's own parser (--help included):
        # argparse's REMAINDER cannot pass on leading options.
        return _guard(lambda: cmd_preprocess(argparse.Namespace(rest=argv[1:])), None)
    parser = build_parser()
    args = parser.parse_args(argv)
    return _guard(lambda: int(args.func(args)), getattr(args, "file", None))


def _guard(run: Callable[[], int], source: str | None) -> int:
    """Run a command, turning every expected failure into a message and an exit code."""
    try:
        return run()
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
