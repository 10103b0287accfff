"""`mjob status NAME` (the story of a job: attempts, failures, pods, events) and
`mjob logs NAME [--rank R] [--attempt A] [-f]`, on the current kubeconfig.

The text is built from the job's own status (the operator's record), its pods and its events;
`describe` is pure, so what a person reads is tested without a cluster.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from megatron_operator.cli.common import EXIT_INVALID, CliError
from megatron_operator.core.names import LABEL_NODE_RANK, LABEL_RESTART_ATTEMPT, pod_name
from megatron_operator.core.observe import pod_view

if TYPE_CHECKING:  # the client takes a second to import: only when a command runs
    from megatron_operator.cluster.kube import Kube

Obj = dict[str, Any]
EVENTS_SHOWN = 20


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="a MegatronJob's story: attempts, failures, pods, events")
    p.add_argument("name", help="the MegatronJob")
    p.add_argument("-n", "--namespace", help="default: the current kubeconfig context's")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="the log of one of a MegatronJob's pods")
    p.add_argument("name", help="the MegatronJob")
    p.add_argument("-n", "--namespace", help="default: the current kubeconfig context's")
    p.add_argument(
        "--rank", type=int, default=0, help="a global rank: the log of the pod that runs it"
    )
    p.add_argument(
        "--attempt",
        type=int,
        help="the restart attempt (default: the current one; a failed attempt's pod exists "
        "while it is kept, restartPolicy.keepFailedPods)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="stream it as it is written")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.set_defaults(func=cmd_logs)


def _connect(args: argparse.Namespace) -> tuple[Kube, str]:
    from megatron_operator.cluster.kube import Kube

    kube = Kube.connect(workers=2)
    return kube, args.namespace or Kube.default_namespace()


def _job(kube: Kube, namespace: str, name: str) -> Obj:
    job = kube.get_job(namespace, name)
    if job is None:
        raise CliError(f"no MegatronJob {name!r} in namespace {namespace!r}", EXIT_INVALID)
    return job


def cmd_status(args: argparse.Namespace) -> int:
    kube, namespace = _connect(args)
    job = _job(kube, namespace, args.name)
    pods = kube.list_pods(namespace, args.name)
    events = kube.job_events(namespace, args.name)
    sys.stdout.write(describe(job, pods, events))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    kube, namespace = _connect(args)
    job = _job(kube, namespace, args.name)
    status = job.get("status") or {}
    procs = int(((job.get("spec") or {}).get("resources") or {}).get("procsPerNode") or 1)
    world = int(status.get("worldSize") or 0)
    if args.rank < 0 or (world and args.rank >= world):
        raise CliError(f"--rank {args.rank}: the job has ranks 0 to {world - 1}", EXIT_INVALID)
    attempt = args.attempt if args.attempt is not None else int(status.get("restartAttempt", 0))
    name = pod_name(args.name, args.rank // procs, attempt)
    have = {p["metadata"]["name"] for p in kube.list_pods(namespace, args.name)}
    if name not in have:
        kept = ", ".join(status.get("keptPods") or []) or "none"
        raise CliError(
            f"pod {name} (rank {args.rank}, attempt {attempt}) does not exist: a failed "
            f"attempt's pods are deleted, but for the failed pod of the last "
            f"restartPolicy.keepFailedPods attempts (kept now: {kept})"
        )
    if args.follow:
        for chunk in kube.follow_pod_log(namespace, name):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    else:
        sys.stdout.write(kube.pod_log(namespace, name, args.tail))
    return 0


# Control characters (C0 with newlines and ESC, DEL, C1) and bidirectional overrides: a pod's
# termination message or an event is written by whoever controls the pod, and printed as it is
# they would move the cursor, recolour or rewrite the terminal, or forge lines of the story.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(value: object) -> str:
    """`value` as text safe for a terminal: each unsafe character as a visible escape."""
    return _UNSAFE.sub(lambda m: ascii(m.group(0))[1:-1], str(value))


def _line(*cells: object, widths: tuple[int, ...]) -> str:
    text = "  ".join(clean(c).ljust(w) for c, w in zip(cells, widths, strict=False))
    return "  " + text.rstrip()


def describe(job: Obj, pods: list[Obj], events: list[Obj]) -> str:
    """The job's story as text: what it is, its attempts and failures, its pods and events."""
    meta, spec, st = job["metadata"], job.get("spec") or {}, job.get("status") or {}
    policy = spec.get("restartPolicy") or {}
    out = [
        clean(
            f"MegatronJob {meta.get('namespace')}/{meta['name']}: {st.get('phase', 'New')}, "
            f"attempt {st.get('restartAttempt', 0)} ({st.get('restarts', 0)} restarts, "
            f"{st.get('restartsCounted', 0)} counted of maxRestarts "
            f"{policy.get('maxRestarts', 3)})"
        ),
        clean(
            f"  layout {st.get('layout', '-')}, {st.get('gpus', 0)} GPUs, world size "
            f"{st.get('worldSize', '-')}; progress {st.get('progressSummary', '-')}"
        ),
    ]
    for key, what in (
        ("startTime", "started"),
        ("runningSince", "running since"),
        ("restartAt", "next attempt at"),
        ("completionTime", "finished"),
    ):
        if st.get(key):
            out.append(clean(f"  {what} {st[key]}"))
    if st.get("localQueue"):
        out.append(clean(f"  queue {st['localQueue']} ({st.get('clusterQueue', 'not admitted')})"))
    defaults = st.get("defaults")
    if isinstance(defaults, dict) and defaults.get("sources"):
        fields = ", ".join(sorted((defaults.get("spec") or {}).keys()))
        out.append(clean(f"  defaults from {', '.join(map(str, defaults['sources']))}: {fields}"))
    failure = st.get("lastFailure")
    if isinstance(failure, dict):
        where = failure.get("pod", "-") + (f" on {failure['node']}" if failure.get("node") else "")
        code = f", exit {failure['exitCode']}" if "exitCode" in failure else ""
        out += [
            "Last failure:",
            clean(
                f"  {failure.get('time', '')} {failure.get('reason')} ({where}{code}) → "
                f"{failure.get('action')}: {failure.get('message', '')}"
            ),
        ]
    restores = [r for r in st.get("restores") or [] if isinstance(r, dict)]
    if restores:
        out.append("Restored from (checkpoint tier and step, per attempt):")
        for r in restores:
            step = f" step {r['step']}" if r.get("step") is not None else ""
            out.append(clean(f"  attempt {r.get('attempt')}: {r.get('tier')}{step}"))
    conditions = [c for c in st.get("conditions") or [] if isinstance(c, dict)]
    if conditions:
        out.append("Conditions:")
        for c in conditions:
            out.append(
                _line(
                    c.get("type"),
                    c.get("status"),
                    c.get("reason"),
                    c.get("message", ""),
                    widths=(16, 6, 22, 0),
                )
            )
    out += _pods(pods, set(st.get("keptPods") or []))
    shown = sorted(events, key=_event_time)[-EVENTS_SHOWN:]
    if shown:
        out.append(f"Events (the last {len(shown)}, oldest first):")
        for e in shown:
            count = f" (×{e['count']})" if (e.get("count") or 1) > 1 else ""
            out.append(
                _line(
                    _event_time(e),
                    e.get("type"),
                    e.get("reason"),
                    f"{e.get('message', '')}{count}",
                    widths=(20, 7, 18, 0),
                )
            )
    return "\n".join(out) + "\n"


def _pods(pods: list[Obj], kept: set[str]) -> list[str]:
    if not pods:
        return ["Pods: none"]
    rows = ["Pods:", _line("NAME", "PHASE", "NODE", "NOTE", widths=(28, 10, 20, 0))]
    for raw in sorted(pods, key=_pod_key):
        x = pod_view(raw)
        note = []
        if x.name in kept:
            note.append("kept for its logs")
        if x.exit_code is not None:
            note.append(f"exit {x.exit_code}")
        if x.waiting is not None:
            note.append(x.waiting[0])
        if x.unschedulable:
            note.append("unschedulable")
        if x.deleting:
            note.append("deleting")
        rows.append(_line(x.name, x.phase, x.node or "-", ", ".join(note), widths=(28, 10, 20, 0)))
    return rows


def _pod_key(raw: Obj) -> tuple[int, int]:
    labels = (raw.get("metadata") or {}).get("labels") or {}
    attempt, rank = labels.get(LABEL_RESTART_ATTEMPT, "0"), labels.get(LABEL_NODE_RANK, "0")
    return (
        int(attempt) if str(attempt).isdigit() else 0,
        int(rank) if str(rank).isdigit() else 0,
    )


def _event_time(e: Obj) -> str:
    return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
