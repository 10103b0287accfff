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
import socket
import statistics
import struct
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
PER_JOB = 5  # node losses timed in one job (see node_loss)


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
        self.losing: str | None = None

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

    def lose(self, reset: bool) -> None:
        """The node is lost: its launcher stops for good inside its own loop (`on_wake`), its
        connection left open and silent (a node cut off, or a kernel gone: no FIN, no RST), or
        reset (`reset`: the container died on a live node, the kernel closes its socket)."""
        self.losing = "reset" if reset else "silent"
        os.write(self.wake_w, b"x")


def run_launchers(args: argparse.Namespace) -> int:
    """`count` agents from node index `first` (node rank 0: with the coordinator); with
    `--spares`, the agents from `nodes` on are the job's spares (`--pod` names a spare made
    again, one agent)."""
    from megatron_contract.ladder import DEFAULT_COORDINATOR_PORT
    from megatron_trainer.agent.agent import Agent
    from megatron_trainer.agent.coordinator import Coordinator
    from megatron_trainer.agent.kubeapi import Api
    from megatron_trainer.agent.sources import JobWatch, LeaseSink
    from megatron_trainer.agent.wire import read_key
    from megatron_trainer.progress import LeaseWriter, Report

    out = Path(args.out)
    lock = threading.Lock()
    starts = (out / f"starts-{args.first}-{os.getpid()}.jsonl").open("a", encoding="utf-8")
    key = read_key(args.key)
    fencing = args.spares > 0

    def record(pod: str, attempt: int, when: float) -> None:
        with lock:
            starts.write(json.dumps({"pod": pod, "attempt": attempt, "time": when}) + "\n")
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
            key=key,
            spares=args.spares,
            pod=f"{args.job}-a0-0",
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
    agents: dict[int, tuple[Agent, StubRanks]] = {}
    port = args.port or DEFAULT_COORDINATOR_PORT
    for node in range(args.first, args.first + args.count):
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)

        def first_step(attempt: int, node: int = node) -> None:
            if node == 0 and progress is not None:
                progress.submit(Report(1 + attempt, 2.0, None, None, None).to_json(attempt))

        spare = node - args.nodes if node >= args.nodes else None
        pod = args.pod or (f"{args.job}-a0-{node}" if spare is None else f"{args.job}-a0-s{spare}")

        def recorded(_node: int, attempt: int, when: float, pod: str = pod) -> None:
            record(pod, attempt, when)  # by pod: a spare made again has the same index

        ranks = StubRanks(node, w, recorded, first_step)
        lost = threading.Event()

        def on_wake(ranks: StubRanks = ranks, lost: threading.Event = lost) -> None:
            if ranks.losing is None:
                return
            agent = agents[ranks.node][0]
            if ranks.losing == "reset" and agent.conn is not None:
                agent.conn.sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                agent.conn.sock.close()
            lost.wait()  # never set: this launcher is gone

        agent = Agent(
            node=node,
            pod=pod,
            nproc=1,
            address=("127.0.0.1", port),
            ranks=ranks,
            key=key,
            wake_fd=r,
            on_wake=on_wake,
            say=lambda text: None,
            fencing=fencing,
            spare=spare,
            ip="127.0.0.1",
        )
        agents[node] = (agent, ranks)
        threading.Thread(target=agent.run, daemon=True).start()
    control = Path(args.control)
    fired: set[str] = set()
    while True:  # the harness asks for failures and losses through the control directory
        for item in sorted(control.glob("*-*")) if control.exists() else []:
            if item.name in fired or not item.name.startswith(("fail-", "lose-", "reset-")):
                continue
            fired.add(item.name)
            what, node = item.name.split("-")[0], int(item.name.split("-")[1])
            if node in agents and (args.pod is None or item.name.endswith(args.pod)):
                if what == "fail":
                    agents[node][1].fail(int(item.read_text() or "1"))
                else:
                    agents[node][1].lose(reset=what == "reset")
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

    common: list[str] = field(default_factory=list)

    def starts(self, attempt: int) -> dict[str, float]:
        """Pod → when its launcher started the ranks of `attempt`."""
        found: dict[str, float] = {}
        for path in self.out.glob("starts-*.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if rec["attempt"] == attempt:
                        found[rec["pod"]] = rec["time"]
        return found

    def fail(self, node: int, code: int = 1) -> float:
        when = time.time()
        (self.out / "control" / f"fail-{node}-{when}").write_text(str(code))
        return when

    def lose(self, node: int, reset: bool = False) -> float:
        """Node index `node`'s launcher is lost (see StubRanks.lose)."""
        when = time.time()
        (self.out / "control" / f"{'reset' if reset else 'lose'}-{node}-{when}").write_text("")
        return when

    def add(self, node: int, pod: str) -> None:
        """A launcher for a pod made during the run (a replacement, or a spare made again)."""
        with (self.out / f"launchers-{pod}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "launchers", "--first", str(node), "--count", "1",
                     "--pod", pod, *self.common],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )  # fmt: skip

    def stop(self) -> None:
        (self.out / "control" / "stop").write_text("")
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def start_launchers(
    b: Bench, ns: str, job: str, nodes: int, out: Path, spares: int = 0
) -> Launchers:
    """1 coordinator process (node rank 0) and the other agents (the spares' after the node
    ranks'), AGENTS_PER_PROCESS a process, with a token of the job's own ServiceAccount and a
    coordinator key of their own (the operator never speaks to the coordinator)."""
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
    key = out / "coordinator.key"
    key.write_bytes(os.urandom(32))
    port = free_port()
    common = [
        "--nodes", str(nodes), "--port", str(port), "--namespace", ns, "--job", job,
        "--api", cluster["server"], "--token", str(token), "--ca", str(ca),
        "--out", str(out), "--control", str(out / "control"), "--key", str(key),
        "--spares", str(spares),
    ]  # fmt: skip
    launchers = Launchers(out, common=common)
    total = nodes + spares
    groups = [(0, 1)] + [
        (first, min(AGENTS_PER_PROCESS, total - first))
        for first in range(1, total, AGENTS_PER_PROCESS)
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


def cluster_view(b: Bench, ns: str, job: str) -> dict[str, str | None]:
    """The job's pods: UID → the node it is bound to (None: not bound yet). Two looks bracket a
    restart: the pods in the second but not the first were created in between, and those bound
    in the second but not the first were bound by the scheduler in between (read from the pods
    themselves, as the scheduler's Scheduled events are rate-limited and arrive late)."""
    return {
        p["metadata"]["uid"]: (p.get("spec") or {}).get("nodeName") or None for p in b.pods(ns, job)
    }


def running_pods(b: Bench, ns: str, job: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in b.pods(ns, job)
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def measure_node_loss(
    b: Bench,
    ns: str,
    job: str,
    launchers: Launchers,
    victim: int,
    attempt: int,
    nodes: int,
    reset: bool,
    replace: bool,
) -> dict[str, float]:
    """Node rank `victim`'s node is lost (its launcher stops; `reset`: its connection is reset,
    else it goes silent): seconds from the loss until every launcher of the gang started
    `attempt`, and the pods created and bound in between. `replace`: the lost pod is replaced
    (ReplacePod): this harness starts the new pod's launcher once kwok runs it, as a kubelet
    would start its container (with the image present and no imports: a lower bound)."""
    before = cluster_view(b, ns, job)
    t0 = launchers.lose(victim, reset=reset)
    if replace:
        name = f"{job}-a{attempt}-{victim}"
        _wait(lambda: name in running_pods(b, ns, job), 120, f"{name} Running", 0.1)
        launchers.add(victim, name)
    starts = _wait(
        lambda: (s := launchers.starts(attempt)) and len(s) == nodes and s,
        120,
        f"every launcher on attempt {attempt}",
        0.05,
    )
    last = max(starts.values())
    after = cluster_view(b, ns, job)
    return {
        "loss → every launcher released": last - t0,
        "pods created": float(len(set(after) - set(before))),
        "pods bound by the scheduler": float(
            sum(1 for uid, node in after.items() if node and not before.get(uid))
        ),
    }


def node_loss_rung(
    b: Bench, n: int, rung: str, spares: int, count: int, suffix: str, work: Path
) -> list[dict[str, float]]:
    """`count` node losses in a fresh job of `n` pods and `spares` spares: onto a spare
    (a silent node, the launcher's heartbeat finds it) or, without one, replaced (a reset
    connection, the most favourable loss for ReplacePod: found at once)."""
    ns, job = f"bench-loss-{rung.lower()}-{suffix}", "loss"
    b.kubectl("create", "namespace", ns)
    b.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(PVC))
    body = b.job(ns, job, n)
    body["spec"]["restartPolicy"] = {
        "strategy": "InPlace",
        "backoffSeconds": 1,
        "maxBackoffSeconds": 1,
        "maxRestarts": 100,
        "hangTimeoutSeconds": 0,
    }
    body["spec"]["resources"]["spareNodes"] = spares
    b.kubectl("apply", "-f", "-", input=json.dumps(body))
    _wait(lambda: len(running_pods(b, ns, job)) == n + spares, 900, "every pod Running", 2.0)
    out = work / f"{rung}-{suffix}"
    out.mkdir()
    launchers = start_launchers(b, ns, job, n, out, spares=spares)

    def spare_ready() -> bool:
        """A spare made again gets its launcher; True once an idle spare (no rank moved onto
        it) runs its launcher and the operator counts it ready: the loss that follows finds
        nothing being made in the background."""
        st = json.loads(b.kubectl("get", "mj", "-n", ns, job, "-o", "json")).get("status") or {}
        held = set((st.get("swaps") or {}).values())
        idle = [x for x in running_pods(b, ns, job) if "-s" in x and x not in held]
        for name in idle:
            made_again = not name.startswith(f"{job}-a0-")
            if made_again and not (out / f"launchers-{name}.log").exists():
                launchers.add(n, name)
        return bool(idle) and bool(st.get("readySpares"))

    figures: list[dict[str, float]] = []
    try:
        _wait(lambda: len(launchers.starts(0)) == n, 300, "attempt 0", 0.1)
        for attempt in range(1, count + 1):
            if spares:
                _wait(spare_ready, 180, "a ready spare", 0.5)
            else:
                time.sleep(3)  # rank 0's first-step report of the last attempt lands
            victim = (attempt * 389) % (n - 1) + 1  # a different node each time, never 0
            result = measure_node_loss(
                b, ns, job, launchers, victim, attempt, n, reset=not spares, replace=not spares
            )
            figures.append(result)
            st = json.loads(b.kubectl("get", "mj", "-n", ns, job, "-o", "json"))["status"]
            print(
                f"{rung} {attempt} (node rank {victim} lost; rung "
                f"{st['lastFailure']['rung']}, swaps {st.get('swaps') or {}}): "
                + ", ".join(f"{k} {v:.2f}" for k, v in result.items()),
                flush=True,
            )
        st = json.loads(b.kubectl("get", "mj", "-n", ns, job, "-o", "json"))["status"]
        print(
            f"{rung}: status after: restarts {st['restarts']}, last rung "
            f"{st['lastFailure']['rung']}",
            flush=True,
        )
    finally:
        launchers.stop()
        b.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=600s")
    return figures


def node_loss(b: Bench, n: int, runs: int, suffix: str, work: Path) -> None:
    """The node-loss ladder at `n` pods: `runs` losses onto a warm spare (SpareSwap), then
    losses without one (ReplacePod) in a job without spares, printed side by side."""
    # At most PER_JOB losses a job: from the sixth attempt of an hour on, the operator's own
    # floor (core/churn.py) doubles the wait before each new attempt, whatever its rung.
    results: dict[str, list[dict[str, float]]] = {"SpareSwap": [], "ReplacePod": []}
    for i, first in enumerate(range(0, runs, PER_JOB)):
        results["SpareSwap"] += node_loss_rung(
            b, n, "SpareSwap", 1, min(PER_JOB, runs - first), f"{suffix}-{i}", work
        )
    results["ReplacePod"] = node_loss_rung(b, n, "ReplacePod", 0, 3, suffix, work)
    for rung, figures in results.items():
        values = sorted(f["loss → every launcher released"] for f in figures)
        p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
        created = sum(f["pods created"] for f in figures)
        bound = sum(f["pods bound by the scheduler"] for f in figures)
        print(
            f"node lost at {n:,} pods, {rung} over {len(values)} runs: loss → every launcher "
            f"released median {statistics.median(values):.2f} s, p99 {p99:.2f} s (the worst "
            f"of {len(values)}), pods created {created:.0f}, scheduler bindings {bound:.0f} in "
            "all",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    la = sub.add_parser("launchers", help="(internal) run launcher instances")
    for name in ("first", "count", "nodes", "port", "spares"):
        la.add_argument(f"--{name}", type=int, required=True)
    for name in ("namespace", "job", "api", "token", "ca", "out", "control", "key"):
        la.add_argument(f"--{name}", required=True)
    la.add_argument("--pod", help="one agent, for this pod made during the run")
    parser.add_argument("--state", help="a running cluster's state dir (default: start one)")
    parser.add_argument(
        "--nodes",
        type=int,
        default=1028,
        help="kwok nodes when starting one (the pods and a spare)",
    )
    parser.add_argument("--pods", type=int, default=1024, help="pods (launchers) of the job")
    parser.add_argument("--restarts", type=int, default=3, help="in-place restarts to time")
    parser.add_argument("--losses", type=int, default=10, help="node losses onto a spare to time")
    parser.add_argument(
        "--only-node-loss", action="store_true", help="the node-loss ladder and Recreate only"
    )
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
        if not args.only_node_loss:
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
        node_loss(b, n, args.losses, suffix, work)
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
