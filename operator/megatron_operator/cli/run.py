"""`mjob run FILE --local`: run a MegatronJob on this machine."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from megatron_contract.env import MSC_CONFIG
from megatron_operator.api import FieldError, SpecError, load_file
from megatron_operator.cli.common import CliError, add_spec_args
from megatron_operator.core.planner import plan


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a MegatronJob (locally, as processes, with the operator's restart semantics)",
    )
    add_spec_args(p)
    p.add_argument(
        "--local",
        action="store_true",
        required=True,
        help="run on this machine (the only mode: use kubectl apply for a cluster)",
    )
    p.add_argument(
        "--workdir", help="where checkpoints, logs and summary.json go (default runs/<job>)"
    )
    p.add_argument(
        "--inject-failure",
        action="append",
        default=[],
        metavar="STEP[:RANK[:SIGNAL]]",
        help="kill a rank when it first reaches STEP (default rank 0, SIGKILL), or with "
        "STEP:podN the whole pod of node rank N; repeatable, each fires once per run",
    )
    p.add_argument(
        "--trust-env",
        action="store_true",
        help="pass spec.env entries that make a process load code (LD_PRELOAD, PYTHONPATH, "
        "PATH, ...) to the local processes; refused by default, since they run on this machine",
    )
    p.set_defaults(func=cmd_run)


def _check_workdir(path: Path) -> None:
    """Fail before any process starts if the workdir cannot be written."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise SpecError(
            [FieldError("--workdir", f"{path} is not a writable directory: {exc.strerror or exc}")]
        ) from None


def cmd_run(args: argparse.Namespace) -> int:
    from megatron_operator.local.inject import check_ranks, parse_injection
    from megatron_operator.local.pods import host_env_problems

    job = load_file(args.file, args.overrides)
    p = plan(job.spec)
    if not args.trust_env and (problems := host_env_problems(job.spec)):
        raise SpecError(problems)
    if job.metadata.uid is None:
        # The apiserver gives every object a uid; locally the workdir plays that part.
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"mjob-local:{job.namespace}/{job.name}"))
        job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"uid": uid})})
    msc = os.environ.get(MSC_CONFIG)
    if job.spec.checkpoint.url is not None and not (msc and os.path.isfile(msc)):
        raise SpecError(
            [
                FieldError(
                    "spec.checkpoint.url",
                    f"a local run reads the MSC config from {MSC_CONFIG} (here "
                    f"{'unset' if not msc else repr(msc) + ', not a file'}): export "
                    f"{MSC_CONFIG}=/path/to/msc_config.yaml with the profile of "
                    f"{job.spec.checkpoint.url}",
                )
            ]
        )
    injections = [parse_injection(text) for text in args.inject_failure]
    check_ranks(injections, p.world_size, p.nodes)
    workdir = Path(args.workdir or Path("runs") / job.name).resolve()
    _check_workdir(workdir)
    try:
        import psutil  # noqa: F401

        import megatron_trainer  # noqa: F401 - only checking that the trainer is installed
    except ImportError as exc:
        raise CliError(
            f"mjob run --local needs the trainer extra ({exc.name} is missing): "
            "pip install -e '.[trainer]'"
        ) from None

    from megatron_operator.local.display import make_display
    from megatron_operator.local.pods import Layout
    from megatron_operator.local.runner import LocalRunner

    train = job.spec.training
    display = make_display(job.name, train.train_iters if train else None)
    image = f"spec.image ({job.spec.image})" if job.spec.image else "the trainer image"
    display.event(
        f"note: {image} is ignored locally: each pod runs as a process group with {sys.executable}"
    )
    for note in local_notes(job):
        display.event(f"note: {note}")
    display.event(
        f"running {job.name}: {p.layout_string()}, {p.nodes} pod(s) × {p.procs_per_node} "
        f"rank(s) on {'CPU' if p.accelerator == 'none' else p.accelerator}; workdir {workdir}"
    )
    layout = Layout(workdir)
    runner = LocalRunner(job, p, layout, display, injections, sys.executable)
    try:
        result = runner.run()
    finally:
        display.close()
    summary = runner.summarize(result)
    _print_summary(summary, result.exit_code)
    return result.exit_code


def local_notes(job: Any) -> list[str]:
    """What of the spec a local run cannot do, said before it starts rather than left out."""
    notes = []
    template = job.spec.template
    pod = template.spec if template is not None else None
    if pod is not None:
        trainer = next((c for c in pod.containers or [] if c.name == "trainer"), None)
        refs = [e.name for e in (trainer.env or []) if e.value_from is not None] if trainer else []
        if refs:
            notes.append(
                f"env from Secrets, ConfigMaps or the pod ({', '.join(refs)}) is not set locally"
            )
        extra = [c.name for c in [*(pod.init_containers or []), *(pod.containers or [])]]
        extra = [n for n in extra if n != "trainer"]
        if extra:
            notes.append(f"the template's other containers ({', '.join(extra)}) do not run locally")
    claims = []
    if job.spec.data is not None and job.spec.data.volume is not None:
        claims.append("data.volume (/mnt/data → <workdir>/data)")
    init = job.spec.checkpoint.init
    if init is not None and init.volume is not None:
        claims.append("checkpoint.init.volume (/mnt/init → <workdir>/init)")
    if claims:
        notes.append(f"claims are not mounted locally: {', '.join(claims)}")
    return notes


def _print_summary(summary: dict[str, Any], code: int) -> None:
    loss = summary["finalLoss"]
    lines = [
        f"{summary['job']}: {summary['status']} ({summary['reason']}) in {summary['elapsedSeconds']}s",
        f"  restarts:      {summary['restarts']}",
        f"  iterations:    {summary['iterations']}",
        f"  final loss:    {loss:.6f}" if isinstance(loss, float) else "  final loss:    -",
        f"  checkpoints:   {summary['checkpointDir']} {summary['checkpoints']}",
    ]
    if Path(summary["tensorboardDir"]).is_dir():  # the built-in trainer's
        lines.append(f"  tensorboard:   {summary['tensorboardDir']}")
    if "lossCurve" in summary:
        lines.append(f"  loss curve:    {summary['lossCurve']}")
    ledger = summary.get("ledger")
    if isinstance(ledger, dict) and isinstance(ledger.get("seconds"), dict):
        from megatron_operator.cli.goodput import bar

        lines.append(
            f"  goodput:       {ledger.get('summary', '-')} [{bar(ledger['seconds'], 40)}]"
        )
    lines.append(f"  summary:       {Path(summary['workdir']) / 'summary.json'}")
    if summary["status"] != "Succeeded":
        lines.append(f"  why:           {summary['message']}")
    stream = sys.stdout if code == 0 else sys.stderr
    print("\n".join(lines), file=stream, flush=True)
