"""The restart ladder on real kubelets: twenty kills at seeded steps, fourteen of one rank process
inside a running pod (restarted in place) and six of node rank 1's container (that pod replaced
alone). Each restart resumes at most one step back, from the pods' memory (in place) or the copy
in the other pod's memory (a replaced pod), and every step's loss, the steps trained again
included, is the uninterrupted run's. Meanwhile a pod of another namespace attacks the job's
coordinator without its key: it poses as node rank 1 and reports exit code 78 (which the default
rules fail a job on) once a second, and holds idle connections, twice the cap, all along. It
changes nothing: the twenty restarts, and the job succeeds.

One job on two of the session's real nodes, with the chart's operator (`real_operator`,
conftest.py) and the trainer image built from Dockerfile.trainer. The rank is killed with `cluster kill-process`
(one process of the container; the launcher, PID 1 of the container, lives on), the container
with `cluster kill-container`. Losses are compared with `mjob run --local` of the same spec, step
by step, as in test_e2e.py.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.paths import PROGRESS_MIN_INTERVAL_SECONDS
from megatron_operator.core.tiers import MAX_RESTORES
from tests.goodput_truth import compare

from .real_nodes_support import OPERATOR_NS, RealCluster, python_pod
from .test_e2e import (
    RANK_LABEL,
    Rank0Logs,
    assert_same_curve,
    job_doc,
    job_status,
    local_losses,
    new_ns,
    pods_of,
    spec,
    wait_phase,
    why,
)

pytestmark = pytest.mark.slow


def uids(c: RealCluster, ns: str, job: str) -> dict[str, str]:
    """Node rank → the uid of the job's live pod of that rank."""
    return {
        p["metadata"]["labels"][RANK_LABEL]: p["metadata"]["uid"]
        for p in pods_of(c, ns, job)
        if not p["metadata"].get("deletionTimestamp")
        and p.get("status", {}).get("phase") not in ("Failed", "Succeeded")
    }


def newest_checkpoint(logs: Rank0Logs) -> int:
    """The newest complete checkpoint rank 0 has reported (0: none yet)."""
    with logs.lock:
        return max((r.get("checkpointIteration") or 0 for r in logs.records), default=0)


def where_pods_wait(c: RealCluster, ns: str) -> str:
    """The namespace's pods, their nodes and the events: why a pod is not Running."""
    pods = c.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
    seen = c.kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False)
    nodes = c.kubectl("get", "nodes", "-o", "wide", check=False)
    return "\n".join(
        (pods.stdout, pods.stderr, seen.stdout[-6000:], seen.stderr, nodes.stdout, nodes.stderr)
    )


def wait_attempt_step(
    c: RealCluster, logs: Rank0Logs, attempt: int, after: int, timeout: float = 300
) -> dict[str, Any]:
    """Rank 0's first progress record of `attempt` beyond iteration `after` (its log)."""

    def stepped() -> dict[str, Any] | None:
        with logs.lock:
            found = [r for r in logs.records if r.get("attempt") == attempt]
        return found[0] if found and max(r["iteration"] for r in found) > after else None

    result: dict[str, Any] = c.wait(stepped, timeout, 0.5, f"a step of attempt {attempt}")
    return result


# The intruder: every second a hello as node rank 1 under a guessed key and a failure with exit
# code 78; and 64 connections that never say hello, reopened as the coordinator closes them.
INTRUDER = """
import json, socket, sys, time
from megatron_trainer.agent.wire import MAX_PENDING, encode, hello_mac
host, port = sys.argv[1], 29400
idle, challenges, welcomed = [], 0, 0
def connect():
    return socket.create_connection((host, port), timeout=5)
def still_open(sock):
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
while True:
    try:
        s = connect()
        line = s.makefile("rb").readline()
        challenges += 1
        hello = {"op": "hello", "node": 1, "pod": "x", "epoch": 0, "nonce": "ab" * 32}
        hello["mac"] = hello_mac(b"guessed-key-guessed-key", json.loads(line)["nonce"], hello)
        failed = {"op": "failed", "epoch": 0, "local": 0, "code": 78, "time": "2026-01-01T00:00:00Z"}
        s.sendall(encode(hello) + encode(failed))
        s.settimeout(5)
        welcomed += b"welcome" in s.recv(4096)
        s.close()
        idle = [i for i in idle if still_open(i) or i.close()]
        while len(idle) < 2 * MAX_PENDING:
            idle.append(connect())
    except OSError as err:
        print("intruder:", err, flush=True)
    print(f"intruder: challenges={challenges} welcomed={welcomed}", flush=True)
    time.sleep(1)
"""


def intrude(c: RealCluster, ns: str, job_ns: str) -> None:
    """The intruder's pod, in `ns`, against the coordinator of the job `ladder` in `job_ns`."""
    rank0 = next(
        p for p in pods_of(c, job_ns, "ladder") if p["metadata"]["labels"][RANK_LABEL] == "0"
    )
    ip, node = rank0["status"]["podIP"], rank0["spec"]["nodeName"]
    doc = python_pod("intruder", c.image("trainer"), node, INTRUDER)
    doc["spec"]["containers"][0]["command"] += [ip]
    c.apply(doc, ns)


def intruder_counts(c: RealCluster, ns: str) -> tuple[int, int]:
    """(challenges the intruder received, welcomes), from its last report line."""
    out = c.kubectl("logs", "-n", ns, "intruder", "--tail", "20", check=False).stdout
    lines = [line for line in out.splitlines() if "challenges=" in line]
    if not lines:
        return 0, 0
    fields = dict(part.split("=") for part in lines[-1].split()[1:])
    return int(fields["challenges"]), int(fields["welcomed"])


def check_restored(logs: Rank0Logs, attempt: int, *tiers: str) -> str:
    """The attempt restored from one of `tiers`, at most one step behind the last step an earlier
    attempt reported (the trainer's own records). A kill that lands in the memory snapshot of a
    step the durable checkpoint also saved leaves that step only there: the durable tier is then
    the newest (tiers.choose), and as good, so it passes too."""
    first = next(r for r in logs.records if r.get("attempt") == attempt)
    before = max(r["iteration"] for r in logs.records if r.get("attempt", 0) < attempt)
    restored = first["restored"]
    assert restored["tier"] in (*tiers, "Durable"), (restored, before)
    assert before - restored["step"] <= 1, (restored, before)
    return str(restored["tier"])


# The seeded kill points on real kubelets: each is the first moment the test sees rank 0's
# record of that step (kubectl logs), so the kill lands anywhere in the steps after it: in the
# forward or backward pass, in a snapshot's write beside it, in a durable save. A rank killed
# restarts in place; node rank 1's container killed replaces its pod alone.
KILL_SEED = 40
RANK_KILLS, CONTAINER_KILLS = 14, 6
FIRST_KILL, KILL_GAP = 6, 3  # the first kill point, and at least this many steps between two
LADDER_ITERS = 80


def kill_points() -> list[tuple[int, str, int]]:
    """(step, kind, global rank) for each kill: kind "rank" (that rank's process) or
    "container" (node rank 1's container; the rank is unused)."""
    rng = random.Random(KILL_SEED)
    count = RANK_KILLS + CONTAINER_KILLS
    spread = LADDER_ITERS - FIRST_KILL - KILL_GAP * count - 4
    steps = [
        FIRST_KILL + s + KILL_GAP * i
        for i, s in enumerate(sorted(rng.choices(range(spread), k=count)))
    ]
    kinds = rng.sample(["rank"] * RANK_KILLS + ["container"] * CONTAINER_KILLS, count)
    return [(step, kind, rng.randrange(4)) for step, kind in zip(steps, kinds, strict=True)]


def test_twenty_kills_in_place_and_of_one_pod_each_lose_at_most_one_step(
    real_operator: RealCluster, tmp_path: Path
) -> None:
    c = real_operator
    ns = new_ns(c, "ladder")
    other = new_ns(c, "intruder")
    s = spec(c.image("trainer"), **{"restartPolicy.strategy": "InPlace"})
    s["training"]["trainIters"] = LADDER_ITERS
    # Room for the kills, without the backoff growing between them; on two nodes every kill
    # after the second is on a node that failed before, which would recreate the gang.
    s["restartPolicy"].update(
        maxRestarts=len(kill_points()) + 5,
        maxBackoffSeconds=1,
        recreateOnRepeatedNodeFailure=False,
    )
    c.apply(job_doc("ladder", s), ns)
    logs = Rank0Logs(c, ns, "ladder")
    tiers: list[str] = ["None"]
    try:
        try:
            wait_phase(c, ns, "ladder", {"Running"}, 300)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where_pods_wait(c, ns)}") from None
        intrude(c, other, ns)
        c.wait(lambda: intruder_counts(c, other)[0] >= 3, 120, 1, "the intruder's hellos")
        first = uids(c, ns, "ladder")
        assert set(first) == {"0", "1"}
        try:
            kill_and_check(c, ns, logs, tiers)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{what_happened(c, ns, logs)}") from None
        replaced = next(
            p
            for p in pods_of(c, ns, "ladder")
            if p["metadata"]["uid"] == uids(c, ns, "ladder")["1"]
        )
        assert replaced["spec"]["hostname"] == "ladder-1"

        done = wait_phase(c, ns, "ladder", {"Succeeded", "Failed"}, 900)
        assert done["phase"] == "Succeeded", why(done)
        # The kills and nothing of the intruder.
        assert done["restarts"] == len(kill_points()), done
        # The status says the same tiers as the trainer's records (checked above), for the
        # newest attempts it keeps.
        kept = [(r["attempt"], r["tier"]) for r in done["restores"]]
        assert kept == list(enumerate(tiers))[-MAX_RESTORES:], kept
        challenges, welcomed = intruder_counts(c, other)
        assert challenges > 10 and welcomed == 0, (challenges, welcomed)
    finally:
        logs.close()
        # The session's other scenarios share these nodes: never leave this job training.
        c.kubectl("delete", "namespace", ns, "--wait=false")
        c.kubectl("delete", "namespace", other, "--wait=false")
    local = local_losses(tmp_path, "ladder", s)
    worst = assert_same_curve(logs.losses, local, LADDER_ITERS)
    # Every record, the steps trained again after a resume included, has the uninterrupted
    # run's loss at that step.
    with logs.lock:
        trained = [(r["iteration"], r["loss"]) for r in logs.records if "loss" in r]
    assert len(trained) > LADDER_ITERS, len(trained)
    assert all(abs(loss - local[i]) <= 1e-6 * abs(local[i]) for i, loss in trained), [
        (i, loss, local[i]) for i, loss in trained if loss != local[i]
    ]
    lines = logs.text().splitlines()
    print(
        f"ladder: {len(kill_points())} kills, restored from {tiers[1:]}; worst relative "
        f"difference to local {worst:.1e}",
        file=sys.stderr,
    )
    print("\n".join(line for line in lines if "megatron_trainer:" in line)[-4000:], file=sys.stderr)


def kill_and_check(c: RealCluster, ns: str, logs: Rank0Logs, tiers: list[str]) -> None:
    """Each kill point in turn: kill, wait for the next attempt's first step, check its rung,
    its pods and the tier it restored from (appended to `tiers`)."""
    for attempt, (step, kind, rank) in enumerate(kill_points()):
        wait_attempt_step(c, logs, attempt=attempt, after=step - 1)
        before = uids(c, ns, "ladder")
        if kind == "rank":  # node rank = rank // procsPerNode
            pod = _pod_name(c, ns, str(rank // 2))
            killed = c.kill_process(ns, pod, "megatron_trainer.worker", RANK=str(rank))
            assert (
                killed["signal"] == "SIGKILL" and "megatron_trainer.worker" in killed["command"]
            ), killed
        else:
            assert c.kill_container(ns, _pod_name(c, ns, "1"), "KILL")["signal"] == "SIGKILL"
        wait_attempt_step(c, logs, attempt=attempt + 1, after=0)
        st = job_status(c, ns, "ladder")
        assert st["restarts"] == attempt + 1, (attempt, kind, st.get("lastFailure"))
        now = uids(c, ns, "ladder")
        if kind == "rank":
            # In place: the same pods; from every pod's own memory, or, where the kill
            # landed in a snapshot's write after its copies were exchanged, from the copy in
            # the other pod (the same step).
            assert st["lastFailure"]["rung"] == "InPlace", (attempt, st["lastFailure"])
            assert now == before, (attempt, before, now)
            tiers.append(check_restored(logs, attempt + 1, "Memory", "Peer"))
        else:
            # Node rank 1's pod alone is replaced; its ranks from the copy in node rank 0's
            # memory, node rank 0's from their own.
            assert st["lastFailure"]["rung"] == "ReplacePod", (attempt, st["lastFailure"])
            assert now["0"] == before["0"] and now["1"] != before["1"], (before, now)
            tiers.append(check_restored(logs, attempt + 1, "Peer"))


def what_happened(c: RealCluster, ns: str, logs: Rank0Logs) -> str:
    """The job's pods' logs and the operator's, for a failed scenario."""
    parts = [where_pods_wait(c, ns), "--- node rank 0's log (tail):", logs.text()[-6000:]]
    for pod in pods_of(c, ns, "ladder"):
        name = pod["metadata"]["name"]
        out = c.kubectl("logs", "-n", ns, name, "--tail", "60", check=False)
        parts += [f"--- {name} (tail):", out.stdout, out.stderr]
    operator = c.kubectl(
        "logs", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=megatron-operator",
        "--tail", "150", check=False,
    )  # fmt: skip
    return "\n".join([*parts, "--- the operator (tail):", operator.stdout, operator.stderr])


def _pod_name(c: RealCluster, ns: str, node_rank: str) -> str:
    """The live pod of `node_rank`."""
    live = uids(c, ns, "ladder")[node_rank]
    return str(
        next(
            p["metadata"]["name"] for p in pods_of(c, ns, "ladder") if p["metadata"]["uid"] == live
        )
    )


# restartPolicy.hangTimeoutSeconds of the hang scenario: between records only (until its first
# step a new gang is held to firstStepTimeoutSeconds: under CI load that step came over 30 s
# after the pods ran, and a hang timeout counted from there restarted attempt 0 before it).
HANG_TIMEOUT = 30
HANG_STEP = 10


def test_a_hung_rank_is_restarted_in_place_and_the_wait_accounted(
    real_operator: RealCluster, tmp_path: Path
) -> None:
    """Rank 1 stops itself (SIGSTOP, MEGATRON_INJECT_FAILURE `10:1:STOP`) after step 10: the
    gang waits in its next collective and rank 0's records stop. The hang rule restarts the gang
    in place after hangTimeoutSeconds, attempt 1 resumes from memory, the losses equal `mjob run
    --local` of the job without the hang, and the goodput ledger holds to the trainer's records:
    the wait is hangDetection, from the last record to the decision."""
    c = real_operator
    ns = new_ns(c, "hang")
    plain = spec(c.image("trainer"), **{"restartPolicy.strategy": "InPlace"})
    s = spec(
        c.image("trainer"),
        **{
            "restartPolicy.strategy": "InPlace",
            "restartPolicy.hangTimeoutSeconds": HANG_TIMEOUT,
        },
    )
    s["env"] = [{"name": "MEGATRON_INJECT_FAILURE", "value": f"{HANG_STEP}:1:STOP"}]
    c.apply(job_doc("hang", s), ns)
    logs = Rank0Logs(c, ns, "hang")
    try:
        resumed = wait_attempt_step(c, logs, attempt=1, after=0, timeout=600)
        done = wait_phase(c, ns, "hang", {"Succeeded", "Failed"}, 900)
        assert done["phase"] == "Succeeded", why(done)
        assert done["restarts"] == 1, done
        failure = done["lastFailure"]
        assert (failure["reason"], failure["rung"]) == ("Hang", "InPlace"), failure
        before = [r["iteration"] for r in logs.records if r.get("attempt") == 0]
        assert before, f"no record of attempt 0 in rank 0's log:\n{logs.text()[:6000]}"
        assert max(before) == HANG_STEP, before
        assert resumed["restored"]["tier"] == "Memory", resumed
        assert HANG_STEP - resumed["restored"]["step"] <= 1, resumed
    finally:
        logs.close()
        c.kubectl("delete", "namespace", ns, "--wait=false")
    worst = assert_same_curve(logs.losses, local_losses(tmp_path, "ladder", plain), 30)
    # The hang as a kill at rank 0's last record (no work in flight: it is inside hangDetection,
    # from the last sign of life, the record's whole second, to the decision). The operator sees
    # rank 0's records through its Lease, written at most every PROGRESS_MIN_INTERVAL_SECONDS:
    # the steps after the last write it saw are hangDetection in the ledger and their replay new
    # work, so the ledger is held to the truth as it could have seen it (`view_lag`), with that
    # much slack on the recomputed seconds (the truth's view counts those steps there).
    stopped_at = max(
        r["clock"]["now"]
        for r in logs.records
        if r.get("attempt") == 0 and isinstance(r.get("clock"), dict)
    )
    lag = PROGRESS_MIN_INTERVAL_SECONDS + 2
    figures = compare(done["ledger"], logs.records, [stopped_at], lag, view_lag=lag)
    waited = done["ledger"]["seconds"]["hangDetection"]
    assert HANG_TIMEOUT - 1 <= waited <= HANG_TIMEOUT + 5, done["ledger"]
    print(
        f"hang: rank 1 stopped after step {HANG_STEP}, restarted in place after {waited:.1f} s of "
        f"hangDetection; goodput {figures['goodput']:.3f} (true {figures['true goodput']:.3f}); "
        f"worst relative difference to local {worst:.1e}",
        file=sys.stderr,
    )
