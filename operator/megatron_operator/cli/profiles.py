"""`mjob profiles NAME`: list a job's profiler captures (spec.profiling) and copy them out."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from megatron_operator.cli.common import EXIT_INVALID, CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "profiles",
        help="list a job's profiler captures (torch, viztracer, nsys) and copy them out",
    )
    p.add_argument("name", help="the job's name (its local run is runs/NAME unless --workdir)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workdir", help="the local run's workdir (default runs/NAME)")
    where.add_argument(
        "--checkpoint-dir",
        metavar="DIR_OR_URL",
        help="the job's checkpoint directory (e.g. its claim, mounted) or msc:// URL",
    )
    p.add_argument("--attempt", type=int, help="only this restart attempt's captures")
    p.add_argument("--copy-to", metavar="DIR", help="copy the captures to DIR/<attempt>/")
    p.set_defaults(func=cmd_profiles)


def _checkpoint_dir(args: argparse.Namespace) -> str:
    if args.checkpoint_dir:
        return str(args.checkpoint_dir)
    workdir = Path(args.workdir or Path("runs") / args.name)
    summary = workdir / "summary.json"
    try:
        doc = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise CliError(
            f"no local run of {args.name} in {workdir} (no readable summary.json): give "
            "--workdir, or --checkpoint-dir with the job's checkpoint directory or msc:// URL",
            EXIT_INVALID,
        ) from None
    if doc.get("job") != args.name:
        raise CliError(f"{summary} is the run of {doc.get('job')!r}, not {args.name!r}")
    return str(doc["checkpointDir"])


def cmd_profiles(args: argparse.Namespace) -> int:
    from megatron_operator.local.profiles import copy_out, find

    where = _checkpoint_dir(args)
    captures = find(where)
    if args.attempt is not None:
        captures = [c for c in captures if c.attempt == args.attempt]
    if not captures:
        print(f"{args.name}: no profiler captures in {where}/profiles")
        return 0
    print(f"{args.name}: {len(captures)} capture(s) in {where}/profiles")
    for c in captures:
        size = f"{c.size / 1e6:.1f} MB" if c.size is not None else "?"
        print(f"  attempt {c.attempt}  {c.name:<28} {size:>10}  {c.source}")
    if args.copy_to:
        written = copy_out(captures, Path(args.copy_to))
        print(f"copied {len(written)} file(s) to {args.copy_to}")
    return 0
