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
                "pip install -e '.[trainer]' from a checkout of this repository"
            ) from None
        rest: list[str] = args.rest
        return int(module.main(rest))

    return run


PASSTHROUGH = {name: _tool(name) for name in TOOLS}


def cmd_preprocess_job(args: argparse.Namespace) -> int:
    """Print `mjob preprocess ARGS` as a Kubernetes Job on the data claim."""
    import sys

    from megatron_operator.cli.common import EXIT_INVALID, dump, read_defaults
    from megatron_operator.core.defaults import platform
    from megatron_operator.core.preprocess import preprocess_job, problems

    rest = [a for a in args.rest if a != "--"]
    found = problems(rest)
    if found:
        raise CliError("; ".join(str(e) for e in found), EXIT_INVALID)
    merged = read_defaults(args.defaults)
    secrets = [
        s["name"]
        for s in (merged.get("template", {}).get("spec", {}).get("imagePullSecrets") or [])
        if isinstance(s, dict) and "name" in s
    ]
    job = preprocess_job(
        args.name,
        args.claim,
        rest,
        image=args.image or merged.get("image"),
        requests={"cpu": args.cpu, "memory": args.memory},
        sub_path=args.sub_path,
        platform=platform(merged),
        pull_secrets=secrets,
    )
    sys.stdout.write(dump(job, args.output))
    return 0


def register(sub: Any) -> None:
    for name, (_, help_text) in TOOLS.items():
        p = sub.add_parser(name, help=f"{help_text} (see mjob {name} --help)", add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=PASSTHROUGH[name])
    p = sub.add_parser(
        "preprocess-job",
        help="print `mjob preprocess` as a Kubernetes Job writing to the data claim (pipe it to "
        "kubectl apply -f -)",
    )
    p.add_argument("--claim", required=True, help="the data claim, mounted read-write at /mnt/data")
    p.add_argument("--name", default="preprocess", help="the Job's name (default preprocess)")
    p.add_argument(
        "--image", default=None, help="default: the trainer image of --defaults, or the built-in"
    )
    p.add_argument("--sub-path", default=None, help="a directory of the claim to mount instead")
    p.add_argument("--cpu", default="8", help="cpu request (default 8)")
    p.add_argument("--memory", default="32Gi", help="memory request (default 32Gi)")
    p.add_argument(
        "--defaults",
        action="append",
        default=[],
        metavar="FILE",
        help="a MegatronJobDefaults (or the operator's --job-defaults file): image, identity, "
        "pull secrets",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then mjob preprocess's arguments")
    p.set_defaults(func=cmd_preprocess_job)
