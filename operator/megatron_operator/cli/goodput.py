"""`mjob goodput NAME` (a job on the current kubeconfig) and `mjob goodput --workdir DIR` (a local
run's status.json): where the job's wall time went, by cause, as a table and a bar, and its
forecast. `render` is pure, so what a person reads is tested without a cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from megatron_operator.api.status import Cause
from megatron_operator.cli.common import EXIT_INVALID, CliError
from megatron_operator.core.forecast import duration

Obj = dict[str, Any]
BAR_WIDTH = 60

# One character per cause in the bar; productive time is the solid block.
MARKS: dict[Cause, str] = {
    Cause.PRODUCTIVE: "█",
    Cause.RECOMPUTED: "r",
    Cause.CHECKPOINT_SAVE: "s",
    Cause.CHECKPOINT_LOAD: "l",
    Cause.RENDEZVOUS: "v",
    Cause.START_UP: "u",
    Cause.SCHEDULING: "c",
    Cause.QUEUED: "q",
    Cause.RESTART_IN_PLACE: "i",
    Cause.RESTART_REPLACE_POD: "p",
    Cause.RESTART_SPARE_SWAP: "w",
    Cause.RESTART_RECREATE: "x",
    Cause.HANG_DETECTION: "h",
    Cause.SUSPENDED: "z",
    Cause.FINISHING: "f",
    Cause.NOT_REPORTED: "n",
    Cause.UNATTRIBUTED: "?",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "goodput", help="where a MegatronJob's wall time went, by cause, and when it should end"
    )
    p.add_argument("name", nargs="?", help="the MegatronJob (on the current kubeconfig)")
    p.add_argument("-n", "--namespace", help="default: the current kubeconfig context's")
    p.add_argument("--workdir", help="instead: a local run's workdir (mjob run --local)")
    p.set_defaults(func=cmd_goodput)


def cmd_goodput(args: argparse.Namespace) -> int:
    if args.workdir:
        path = Path(args.workdir) / "status.json"
        try:
            status = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CliError(f"--workdir: cannot read {path}: {exc}", EXIT_INVALID) from None
        name = Path(args.workdir).name
    elif args.name:
        from megatron_operator.cluster.kube import Kube

        kube = Kube.connect(workers=2)
        namespace = args.namespace or Kube.default_namespace()
        job = kube.get_job(namespace, args.name)
        if job is None:
            raise CliError(f"no MegatronJob {args.name!r} in namespace {namespace!r}", EXIT_INVALID)
        status, name = job.get("status") or {}, f"{namespace}/{args.name}"
    else:
        raise CliError("give a MegatronJob NAME, or --workdir DIR of a local run", EXIT_INVALID)
    sys.stdout.write(render(name, status if isinstance(status, dict) else {}))
    return 0


def bar(seconds: dict[str, float], width: int = BAR_WIDTH) -> str:
    """The wall time as one line of `width` characters, each cause its share (largest
    remainders, so the marks add up to the width and a cause of any size above 1/width shows)."""
    total = sum(seconds.values())
    if total <= 0:
        return "·" * width
    shares = [(c, seconds.get(str(c), 0.0) * width / total) for c in MARKS]
    counts = {c: int(s) for c, s in shares}
    left = width - sum(counts.values())
    for c, _ in sorted(shares, key=lambda cs: cs[1] - int(cs[1]), reverse=True)[:left]:
        counts[c] += 1
    return "".join(MARKS[c] * counts[c] for c in MARKS)


def render(name: str, status: Obj) -> str:
    """The ledger as text: the goodput, a bar, a table by cause, the restarts' cost by rung and
    the forecast."""
    ledger = status.get("ledger")
    if not isinstance(ledger, dict) or not isinstance(ledger.get("seconds"), dict):
        return f"{name}: no goodput ledger yet (the operator writes it as the job runs)\n"
    seconds: dict[str, float] = {
        k: float(v) for k, v in ledger["seconds"].items() if isinstance(v, (int, float))
    }
    wall = float(ledger.get("wallSeconds") or 0.0)
    out = [
        f"{name}: goodput {ledger.get('summary', '-')} of {duration(wall)} wall time "
        f"(as of {ledger.get('asOf', '-')})",
        f"  [{bar(seconds)}]",
        f"  {'cause':<20}{'seconds':>12}{'share':>9}  mark",
    ]
    for cause in sorted(MARKS, key=lambda c: -seconds.get(str(c), 0.0)):
        value = seconds.get(str(cause), 0.0)
        if value > 0:
            share = value / wall if wall > 0 else 0.0
            out.append(f"  {cause!s:<20}{value:>12.1f}{share:>9.1%}  {MARKS[cause]}")
    restarts = [r for r in ledger.get("restarts") or [] if isinstance(r, dict)]
    if restarts:
        out.append("  restarts (from the failure to the next attempt's first step):")
        for r in restarts:
            count = r.get("count") or 0
            cost = float(r.get("seconds") or 0.0)
            mean = f", {cost / count:.1f}s each" if count else ""
            out.append(f"    {r.get('rung')}: {count}, {cost:.1f}s{mean}")
    forecast = status.get("forecast")
    if isinstance(forecast, dict):
        out.append(
            f"  forecast: {forecast.get('summary', '-')} to go, ETA {forecast.get('eta', '-')} "
            f"(p90 {forecast.get('etaP90', '-')}); without failures "
            f"{duration(float(forecast.get('blindSeconds') or 0.0))}; "
            f"{forecast.get('failuresPerHour', 0):.3g} failures/h at "
            f"{duration(float(forecast.get('secondsPerFailure') or 0.0))} each"
        )
    return "\n".join(out) + "\n"
