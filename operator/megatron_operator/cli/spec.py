"""`mjob validate / plan / render / crd`: look at a spec without touching a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from megatron_operator.cli.common import (
    EXIT_INVALID,
    CliError,
    add_defaults_arg,
    add_spec_args,
    dump,
    load_and_plan,
    load_resolved,
)

if TYPE_CHECKING:
    from megatron_operator.api import MegatronJob
    from megatron_operator.core.planner import Plan


def _note(text: str) -> None:
    print(text, file=sys.stderr)


def cmd_validate(args: argparse.Namespace) -> int:
    """Every MegatronJob of the file (or of stdin, `-`), each valid or with its problems."""
    from megatron_operator.api import SpecError, read_documents
    from megatron_operator.cli.common import read_defaults, resolve_doc

    merged = read_defaults(args.defaults)
    invalid = 0
    for source, doc in read_documents(args.file):
        if doc.get("kind", "MegatronJob") != "MegatronJob":
            print(f"{source}: {doc.get('kind')} skipped (not a MegatronJob)")
            continue
        try:
            job, p, _ = resolve_doc(doc, source, args.overrides, merged)
        except SpecError as exc:
            invalid += 1
            n = len(exc.errors)
            print(
                f"error: {source} is invalid ({n} problem{'s' if n != 1 else ''}):", file=sys.stderr
            )
            for err in exc.errors:
                print(f"  - {err}", file=sys.stderr)
            continue
        _print_valid(source, job, p)
    return EXIT_INVALID if invalid else 0


def _print_valid(source: str, job: MegatronJob, p: Plan) -> None:
    from megatron_operator.core import command
    from megatron_operator.core.advice import warnings

    memory = (
        f"~{p.memory.per_gpu_gib:.1f} GiB per GPU"
        if p.memory is not None
        else "memory not estimated (no spec.model and spec.training)"
    )
    runs = f"; runs {' '.join(job.spec.trainer.command)}" if job.spec.trainer else ""
    print(
        f"{source}: MegatronJob {job.name} is valid: {p.layout_string()} on {p.nodes} × "
        f"{p.procs_per_node} ({p.world_size} ranks), {memory}{tiers_text(job.spec, p)}{runs}"
    )
    for w in [*warnings(job.spec), *command.warnings(job.spec)]:
        print(f"  warning: {w}")


def cmd_plan(args: argparse.Namespace) -> int:
    if args.suggest:
        return _suggest(args)
    job, p = load_and_plan(args.file, args.overrides)
    if args.output == "table":
        from megatron_operator.cli.plan_table import print_plan

        print_plan(p, max_nodes=args.max_nodes)
        text = tiers_text(job.spec, p)
        if text:
            print(text[2].upper() + text[3:])
    else:
        doc = p.to_dict()
        doc["memoryCheckpointBytesPerPod"] = _held(job.spec, p)
        sys.stdout.write(dump(doc, args.output))
    return 0


def _suggest(args: argparse.Namespace) -> int:
    from megatron_operator.api import load_file
    from megatron_operator.core.layouts import UNVERIFIED
    from megatron_operator.core.planner import auto_choice, suggestions

    if args.top < 1:
        raise CliError("--top must be 1 or more", EXIT_INVALID)
    job = load_file(args.file, args.overrides)
    found = suggestions(job.spec)
    chosen = auto_choice(found)
    auto_index = None if chosen is None else found.index(chosen)
    shown = found[: args.top]
    rows = [_row(job.spec, s) for s in shown]
    if args.output != "table":
        doc = {
            "job": job.name,
            "valid": len(found),
            "suggestions": rows,
            # Where auto's choice ranks (1-based); None when no tested layout fits.
            "autoRank": None if auto_index is None else auto_index + 1,
        }
        sys.stdout.write(dump(doc, args.output))
        return 0
    r = job.spec.resources
    print(
        f"{job.name}: {len(found)} valid layouts fit {r.nodes} × {r.procs_per_node} GPUs of "
        f"{r.gpu_memory_gib:g} GiB; the best {len(rows)} (relative step time: 1.00 = every "
        "FLOP at full speed, nothing exposed)"
    )
    for i, s in enumerate(shown):
        _print_row(i + 1, job.spec, s, auto_index == i)
    if auto_index is not None and auto_index >= len(shown):
        print("  …")
        _print_row(auto_index + 1, job.spec, found[auto_index], True)
    if not rows:
        print("  none: add nodes, lower training.microBatchSize, or use GPUs with more memory")
    elif auto_index is None:
        print("  parallelism.auto runs none of these: each uses a kind of parallelism no test of")
        print("  this project has run (set the degrees yourself to run one)")
    untested = sorted({f for s in shown for f in s.unverified})
    for family in untested:
        print(f"  unverified {family.value}: {UNVERIFIED[family]}")
    return 0


def _row(spec: Any, s: Any) -> dict[str, Any]:
    """A suggestion as JSON, with the host memory its in-memory checkpoints hold per pod."""
    from megatron_operator.core import tiers
    from megatron_operator.core.planner import auto_view

    _, degrees, training, memory = auto_view(s.plan)
    row: dict[str, Any] = s.to_dict(s.plan.layout_string(), memory)
    held = tiers.pod_bytes(spec, memory, degrees, training.precision)
    row["memoryCheckpointGiBPerPod"] = None if held is None else round(held / 1024**3, 2)
    return row


def _held(spec: Any, p: Any) -> int | None:
    from megatron_operator.core import tiers

    precision = p.training.precision if p.training is not None else None
    return tiers.pod_bytes(spec, p.memory, p.degrees, precision)


def tiers_text(spec: Any, p: Any) -> str:
    """', ~X GiB of host memory per pod for the in-memory checkpoints' when the job has them."""
    held = _held(spec, p)
    if held is None:
        return ""
    return f", ~{held / 1024**3:.1f} GiB of host memory per pod for in-memory checkpoints"


def _print_row(rank: int, spec: Any, s: Any, auto: bool) -> None:
    row = _row(spec, s)
    mark = "  <- parallelism.auto runs this" if auto else ""
    if s.unverified:
        mark = f"  [unverified: {', '.join(f.value for f in s.unverified)}]"
    tight = ", tight" if row["tight"] else ""
    host = row["memoryCheckpointGiBPerPod"]
    host_text = f"  host {host:.1f} GiB/pod" if host is not None else ""
    print(
        f"{rank:>2}. {row['layout']:<24} recompute {row['recompute']:<9} "
        f"{row['perGpuGiB']:6.1f} GiB{tight}{host_text}  time ×{row['relativeStepTime']:.3f}"
        f"{mark}"
    )
    print(f"      why: {row['why']}")


def cmd_render(args: argparse.Namespace) -> int:
    from megatron_operator.cli.yamlio import write_list
    from megatron_operator.core.render import render_iter

    if args.restart_attempt < 0:
        raise CliError("--restart-attempt must be 0 or more", EXIT_INVALID)
    from megatron_operator.core.defaults import platform

    job, p, merged = load_resolved(args.file, args.overrides, args.defaults, _note)
    objs = render_iter(job, p, args.restart_attempt, platform=platform(merged))
    write_list(objs, args.output, sys.stdout.write)
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from megatron_operator.api.gen import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "validate", help="check a spec; exit 2 with every problem, warn on likely mistakes"
    )
    add_spec_args(p)
    add_defaults_arg(p)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="print the rank→node plan and memory estimate")
    add_spec_args(p)
    p.add_argument("-o", "--output", choices=["json", "yaml", "table"], default="table")
    p.add_argument("--max-nodes", type=int, default=16, help="nodes shown in the table")
    p.add_argument(
        "--suggest",
        action="store_true",
        help="list the valid layouts that fit, best first, with memory and why (the spec's "
        "own degrees are ignored; parallelism.auto runs the best one every part of which a "
        "test of this project has run; the others are marked unverified)",
    )
    p.add_argument("--top", type=int, default=5, help="layouts shown with --suggest")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("render", help="print the Kubernetes objects the operator creates")
    add_spec_args(p)
    add_defaults_arg(p)
    p.add_argument("--restart-attempt", type=int, default=0, metavar="N")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("crd", help="print the MegatronJob CustomResourceDefinition")
    p.set_defaults(func=cmd_crd)
