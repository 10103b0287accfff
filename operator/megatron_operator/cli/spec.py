"""`mjob validate / plan / render / crd`: look at a spec without touching a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from megatron_operator.cli.common import EXIT_INVALID, CliError, add_spec_args, dump, load_and_plan


def cmd_validate(args: argparse.Namespace) -> int:
    job, p = load_and_plan(args.file, args.overrides)
    memory = (
        f"~{p.memory.per_gpu_gib:.1f} GiB per GPU"
        if p.memory is not None
        else "memory not estimated (no spec.model and spec.training)"
    )
    runs = f"; runs {' '.join(job.spec.trainer.command)}" if job.spec.trainer else ""
    print(
        f"{args.file}: MegatronJob {job.name} is valid: {p.layout_string()} on {p.nodes} × "
        f"{p.procs_per_node} ({p.world_size} ranks), {memory}{runs}"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    _, p = load_and_plan(args.file, args.overrides)
    if args.output == "table":
        from megatron_operator.cli.plan_table import print_plan

        print_plan(p, max_nodes=args.max_nodes)
    else:
        sys.stdout.write(dump(p.to_dict(), args.output))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from megatron_operator.core.render import as_list, render

    if args.restart_attempt < 0:
        raise CliError("--restart-attempt must be 0 or more", EXIT_INVALID)
    job, p = load_and_plan(args.file, args.overrides)
    sys.stdout.write(dump(as_list(render(job, p, args.restart_attempt)), args.output))
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from megatron_operator.api.gen import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def register(sub: Any) -> None:
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
