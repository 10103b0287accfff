"""The restart ladder at 1,024 pods, on the local control plane (apiserver, scheduler, kwok).

Measures, with the operator running as a process (`mjob operator`) and 1,024 launcher instances
of the real agent code (`megatron_trainer.agent`: the coordinator with its job watch and its
report writer, and 1,024 agents, each with its own TCP connection; only the ranks are stand-ins,
`StubRanks`, that start instantly):

  1. the initial barrier: the coordinator's start → every launcher started its ranks;
  2. InPlace: a rank of one pod fails → the operator's decision (status.restartAttempt, seen by
     a watch of the job here) → the release after the backoff → every launcher restarted its
     ranks. Goal: decision → every launcher restarted ≤ 5 s (the 1 s backoff floor included);
  3. Recreate at 1,024 pods (a pod failure with `strategy: Recreate`): failure → every pod of the
     next attempt created, and Running. Goal ≤ 30 s to created.

kwok's pods run nothing: the launchers run on this machine, as the pods' launchers would, with
the job's own ServiceAccount token (TokenRequest), so the trainer's RBAC is what is exercised.

Run: python benchmarks/restart_ladder.py              (starts a 1,024-node cluster itself)
     python benchmarks/restart_ladder.py --state DIR  (reuse a running cluster)
     python benchmarks/restart_ladder.py --nodes 128 --pods 128   (smaller, quicker)

`measure_in_place(...)` is the reusable part: given a Running in-place job and its launchers, it
returns the figures of one restart (a peer benchmark can call it).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from megatron_contract.ports import free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from operator_scale import PVC, Bench, _wait, failure_to_recreated  # noqa: E402

AGENTS_PER_PROCESS = 128


# --- the launchers (run in their own processes: `restart_ladder.py launchers ...`) -------------
class StubRanks:
    """Stands in for a pod's rank processes: starting and stopping are instant, a failure is
    injected by `fail`. Every start is recorded with its wall time."""

    def __init__(self, node: int, wake_w: int, record: Any, on_start: Any = None) -> None:
        self.node = node
        self.wake_w = wake_w
        self.record = record
        self.on_start = on_start
        self.attempt: int | None = None
        self.pending: list[tuple[int, int]] = []

    @property
    def running(self) -> bool:
        return self.attempt is not None

    def start(self, attempt: int, port: int) -> None:
        self.attempt = attempt
        self.record(self.node, attempt, time.time())
        if self.on_start is not None:
            self.on_start(attempt)

    def reap(self) -> list[tuple[int, int]]:
        out, self.pending = self.pending, []
        if out:
            self.attempt = None
        return out

    def signal(self, sig: int) -> None:
        self.attempt = None

    def kill(self) -> None:
        self.attempt = None

    def fail(self, code: int) -> None:
        self.pending.append((0, code))
        os.write(self.wake_w, b"x")


def run_launchers(args: argparse.Namespace) -> int:
    """`count` agents from node rank `first` (node rank 0: with the coordinator)."""
    from megatron_contract.ladder import DEFAULT_COORDINATOR_PORT
    from megatron_trainer.agent.agent import Agent
    from megatron_trainer.agent.coordinator import Coordinator
    from megatron_trainer.agent.kubeapi import Api
    from megatron_trainer.agent.sources import JobWatch, LeaseSink
    from megatron_trainer.progress import LeaseWriter, Report

    out = Path(args.out)
    lock = threading.Lock()
    starts = (out / f"starts-{args.first}.jsonl").open("a", encoding="utf-8")

    def record(node: int, attempt: int, when: float) -> None:
        with lock:
            starts.write(json.dumps({"node": node, "attempt": attempt, "time": when}) + "\n")
            starts.flush()

    api = Api(args.api, args.token, args.ca)
    coordinator = None
    progress: LeaseWriter | None = None
    if args.first == 0:
        coordinator = Coordinator(
            args.nodes,
            0,
            29500,
            "127.0.0.1",
            args.port,
            JobWatch(api, args.namespace, args.job),
            LeaseSink(api, args.namespace, f"{args.job}-progress"),
        )
        coordinator.start()
        # Rank 0's own progress writer (progress.py), as the first step of each attempt
        # reports it: the operator sees every in-place attempt train.
        progress = LeaseWriter(
            args.api,
            args.namespace,
            f"{args.job}-progress",
            f"{args.job}-a0-0",
            "megatron.dev/progress",
            token_path=args.token,
            ca_path=args.ca,
        )
    agents: list[tuple[Agent, StubRanks]] = []
    port = args.port or DEFAULT_COORDINATOR_PORT
    for node in range(args.first, args.first + args.count):
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)

        def first_step(attempt: int, node: int = node) -> None:
            if node == 0 and progress is not None:
                progress.submit(Report(1 + attempt, 2.0, None, None, None).to_json(attempt))

        ranks = StubRanks(node, w, record, first_step)
        agent = Agent(
            node=node,
            pod=f"{args.job}-a0-{node}",
            nproc=1,
            address=("127.0.0.1", port),
            ranks=ranks,
            wake_fd=r,
            say=lambda text: None,
        )
        agents.append((agent, ranks))
        threading.Thread(target=agent.run, daemon=True).start()
    control = Path(args.control)
    fired: set[str] = set()
    while True:  # the harness asks for failures through the control directory
        for item in sorted(control.glob("fail-*")) if control.exists() else []:
            if item.name in fired:
                continue
            fired.add(item.name)
            node = int(item.name.split("-")[1])
            if args.first <= node < args.first + args.count:
                agents[node - args.first][1].fail(int(item.read_text() or "1"))
        if (control / "stop").exists():
            break
        time.sleep(0.01)
    if coordinator is not None:
        print(f"report writes: {coordinator.sink.written}", flush=True)  # type: ignore[attr-defined]
    return 0


# --- the harness --------------------------------------------------------------------------------
@dataclass
class Launchers:
    """The launcher processes of one job, and what they recorded."""

    out: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def starts(self, attempt: int) -> dict[int, float]:
        found: dict[int, float] = {}
        for path in self.out.glob("starts-*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec["attempt"] == attempt:
                        found[rec["node"]] = rec["time"]
        return found

    def fail(self, node: int, code: int = 1) -> float:
        when = time.time()
        (self.out / "control" / f"fail-{node}-{when}").write_text(str(code))
        return when

    def stop(self) -> None:
        (self.out / "control" / "stop").write_text("")
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def start_launchers(b: Bench, ns: str, job: str, nodes: int, out: Path) -> Launchers:
    """1 coordinator process (node rank 0) and the other agents, AGENTS_PER_PROCESS a process,
    with a token of the job's own ServiceAccount."""
    cfg = yaml.safe_load(Path(b.kubeconfig).read_text())
    cluster = cfg["clusters"][0]["cluster"]
    ca = out / "ca.crt"
    if "certificate-authority-data" in cluster:
        ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
    token = out / "token"
    token.write_text(b.kubectl("create", "token", f"{job}-trainer", "-n", ns, "--duration=2h"))
    (out / "control").mkdir(parents=True, exist_ok=True)
    port = free_port()
    common = [
        "--nodes", str(nodes), "--port", str(port), "--namespace", ns, "--job", job,
        "--api", cluster["server"], "--token", str(token), "--ca", str(ca),
        "--out", str(out), "--control", str(out / "control"),
    ]  # fmt: skip
    launchers = Launchers(out)
    groups = [(0, 1)] + [
        (first, min(AGENTS_PER_PROCESS, nodes - first))
        for first in range(1, nodes, AGENTS_PER_PROCESS)
    ]
    for first, count in groups:
        with (out / f"launchers-{first}.log").open("wb") as log:
            launchers.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "launchers",
                        "--first",
                        str(first),
                        "--count",
                        str(count),
                        *common,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return launchers


class StatusWatch:
    """A watch of one job (admin identity): when each (restartAttempt, phase) was first seen."""

    def __init__(self, b: Bench, ns: str, job: str) -> None:
        import kubernetes

        self.seen: dict[tuple[int, str], float] = {}
        self.stop = threading.Event()
        api = kubernetes.client.CustomObjectsApi(b.api)
        self.thread = threading.Thread(
            target=self._run, args=(kubernetes.watch.Watch(), api, ns, job), daemon=True
        )
        self.thread.start()

    def _run(self, w: Any, api: Any, ns: str, job: str) -> None:
        while not self.stop.is_set():
            try:
                for event in w.stream(
                    api.list_namespaced_custom_object,
                    "megatron.dev",
                    "v1alpha1",
                    ns,
                    "megatronjobs",
                    field_selector=f"metadata.name={job}",
                    timeout_seconds=60,
                ):
                    st = event["object"].get("status") or {}
                    key = (int(st.get("restartAttempt", 0)), str(st.get("phase")))
                    self.seen.setdefault(key, time.time())
                    if self.stop.is_set():
                        return
            except Exception:  # a broken stream: watch again
                time.sleep(0.2)

    def first(self, attempt: int, released: bool) -> float | None:
        times = [
            t
            for (a, phase), t in self.seen.items()
            if a == attempt and (phase != "Restarting") == released
        ]
        return min(times) if times else None


def measure_in_place(
    launchers: Launchers, watch: StatusWatch, node: int, attempt: int, nodes: int
) -> dict[str, float]:
    """One in-place restart: fail a rank of pod `node`, wait until every launcher started
    `attempt`. Times in seconds from the failure."""
    t0 = launchers.fail(node)
    starts = _wait(
        lambda: (s := launchers.starts(attempt)) and len(s) == nodes and s,
        120,
        f"every launcher on attempt {attempt}",
        0.05,
    )
    decided = _wait(lambda: watch.first(attempt, released=False), 30, "the decision", 0.05)
    released = _wait(lambda: watch.first(attempt, released=True), 30, "the release", 0.05)
    last = max(starts.values())
    return {
        "failure → decision": decided - t0,
        "decision → release (backoff)": released - decided,
        "decision → every launcher restarted": last - decided,
        "release → every launcher restarted": last - released,
        "failure → every launcher restarted": last - t0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    la = sub.add_parser("launchers", help="(internal) run launcher instances")
    for name in ("first", "count", "nodes", "port"):
        la.add_argument(f"--{name}", type=int, required=True)
    for name in ("namespace", "job", "api", "token", "ca", "out", "control"):
        la.add_argument(f"--{name}", required=True)
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument("--nodes", type=int, default=1024, help="kwok nodes when starting one")
    parser.add_argument("--pods", type=int, default=1024, help="pods (launchers) of the job")
    parser.add_argument("--restarts", type=int, default=3, help="in-place restarts to time")
    args = parser.parse_args()
    if args.command == "launchers":
        return run_launchers(args)

    started = args.state is None
    state = Path(args.state or tempfile.mkdtemp(prefix="megatron-ladder-"))
    if started:
        print(f"starting a {args.nodes}-node cluster in {state} …", flush=True)
        subprocess.run(
            [str(REPO / "tests" / "cluster" / "cluster"), "up", "--state", str(state),
             "--nodes", str(args.nodes), "--nodes-per-rack", "4", "--timeout", "600"],
            check=True,
            capture_output=True,
        )  # fmt: skip
    b = Bench(state, keep=not started)
    work = Path(tempfile.mkdtemp(prefix="ladder-launchers-"))
    print(
        f"machine: {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
        f"operator log {state / 'ladder-operator.log'}; launchers in {work}",
        flush=True,
    )
    launchers: Launchers | None = None
    try:
        b.start_operator(state / "ladder-operator.log")
        suffix = os.urandom(3).hex()
        ns, job, n = f"bench-ladder-{suffix}", "ladder", args.pods
        b.kubectl("create", "namespace", ns)
        b.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(PVC))
        body = b.job(ns, job, n)
        body["spec"]["restartPolicy"] = {
            "strategy": "InPlace",
            "backoffSeconds": 1,  # the floor
            "maxBackoffSeconds": 1,
            "maxRestarts": 100,
            "hangTimeoutSeconds": 0,
        }
        b.kubectl("apply", "-f", "-", input=json.dumps(body))
        _wait(
            lambda: sum(p["status"].get("phase") == "Running" for p in b.pods(ns, job)) == n,
            900,
            "every pod Running",
            2.0,
        )
        watch = StatusWatch(b, ns, job)
        t0 = time.time()
        launchers = start_launchers(b, ns, job, n, work)
        first = _wait(
            lambda: (s := launchers.starts(0)) and len(s) == n and s, 300, "attempt 0", 0.1
        )
        print(
            f"{n:,} launchers up and through the initial barrier: {max(first.values()) - t0:.1f} s "
            "(processes started, connected, attempt 0 started everywhere)",
            flush=True,
        )
        figures: list[dict[str, float]] = []
        for attempt in range(1, args.restarts + 1):
            time.sleep(3)  # let rank 0's first-step report of the previous attempt land
            victim = (attempt * 389) % (n - 1) + 1  # a different node each time, never 0
            result = measure_in_place(launchers, watch, victim, attempt, n)
            figures.append(result)
            print(
                f"InPlace restart {attempt} (rank of node rank {victim} failed): "
                + ", ".join(f"{k} {v:.2f} s" for k, v in result.items()),
                flush=True,
            )
        key = "decision → every launcher restarted"
        values = [f[key] for f in figures]
        print(
            f"InPlace at {n:,} launchers: {key} median {statistics.median(values):.2f} s, "
            f"worst {max(values):.2f} s (goal ≤ 5 s, the 1 s backoff floor included)",
            flush=True,
        )
        st = json.loads(b.kubectl("get", "mj", "-n", ns, job, "-o", "json"))["status"]
        print(
            f"status after: restarts {st['restarts']}, rung {st['lastFailure']['rung']}, "
            f"pods created {len(b.pods(ns, job))} (no pod was replaced)",
            flush=True,
        )
        launchers.stop()
        launchers = None
        watch.stop.set()
        b.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=600s")
        if n >= 1024:
            recreate = f"bench-recreate-{suffix}"
            b.kubectl("create", "namespace", recreate)
            b.kubectl("apply", "-n", recreate, "-f", "-", input=json.dumps(PVC))
            t = failure_to_recreated(b, recreate, n)
            print(
                f"Recreate at {n:,} pods: failure → every pod of the next attempt created "
                f"{t:.1f} s (goal ≤ 30 s)",
                flush=True,
            )
            b.kubectl("delete", "namespace", recreate, "--wait=true", "--timeout=600s")
    finally:
        if launchers is not None:
            launchers.stop()
        b.stop_operator()
        if started:
            subprocess.run(
                [str(REPO / "tests" / "cluster" / "cluster"), "down", "--state", str(state)],
                check=False,
                capture_output=True,
            )
            subprocess.run(["rm", "-rf", str(state), str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
