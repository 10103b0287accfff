"""Spare nodes through the pure state machine: spares made with the gang, a lost node rank moved
onto a spare without a pod created or deleted-and-waited-for, node rank 0 moved too, a new spare
made afterwards, and today's ladder without a ready spare (no cluster; `Sim` plays the kubelet
and the launchers' coordinator)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_contract.ladder import parse_decision
from megatron_operator.core import spares
from megatron_operator.core.observe import pod_view
from megatron_operator.core.reconcile import reconcile
from megatron_operator.core.render import pods as render_pods

from .sim import Sim
from .specs import job_of, spec_of

GANG = ["job-a0-0", "job-a0-1", "job-a0-2"]


def _sim(spares_: int = 1, nodes: int = 3, **policy: Any) -> Sim:
    spec = spec_of(
        {
            "resources.nodes": nodes,
            "resources.procsPerNode": 8,
            "resources.spareNodes": spares_,
            "training.globalBatchSize": 8 * nodes * 4,
        }
    )
    spec["restartPolicy"] = {"backoffSeconds": 1, "maxBackoffSeconds": 1, "keepFailedPods": 0}
    spec["restartPolicy"].update(policy)
    return Sim.of_spec(spec)


def _release(sim: Sim) -> list[str]:
    """Step until the restart is released; the pods created on the way."""
    made: list[str] = []
    for _ in range(10):
        out = sim.step()
        made += [p["metadata"]["name"] for p in out.create_pods]
        if sim.status["phase"] != "Restarting":
            break
        sim.tick(1)
    assert sim.status["phase"] != "Restarting", sim.status
    out = sim.step()
    made += [p["metadata"]["name"] for p in out.create_pods]
    return made


def _ready(sim: Sim, **report: Any) -> None:
    """The coordinator reports every idle spare connected, with a majority behind it."""
    idle = [n for n in sim.pods if "-s" in n and n not in (sim.status.get("swaps") or {}).values()]
    sim.report_launchers(spares=idle, **report)
    sim.step()


def test_spares_are_made_with_the_gang_and_counted_in_the_workload() -> None:
    from megatron_operator.core.kueue import render_podsets
    from megatron_operator.core.planner import plan

    sim = _sim(spares_=2)
    sim.start_running()
    assert sorted(sim.pods) == [*GANG, "job-a0-s0", "job-a0-s1"]
    spare = sim.pods["job-a0-s1"]
    assert spare["metadata"]["labels"]["megatron.dev/node-rank"] == "4"  # 3 nodes + spare 1
    env = {e["name"]: e.get("value") for e in spare["spec"]["containers"][0]["env"]}
    assert (env["NODE_RANK"], env["MEGATRON_SPARE_INDEX"], env["MEGATRON_SPARE_NODES"]) == (
        "4",
        "1",
        "2",
    )
    job = job_of({"resources.nodes": 3, "resources.spareNodes": 2, "training.globalBatchSize": 96})
    assert render_podsets(job, plan(job.spec))[0]["count"] == 5
    # Spares are not the gang: the job runs once its node ranks do.
    assert sim.status["phase"] == "Running" and "swaps" not in sim.status
    _ready(sim)
    assert sim.status["readySpares"] == 2


def test_a_lost_node_rank_moves_onto_the_spare_with_no_pod_made_on_the_way() -> None:
    sim = _sim()
    sim.start_running()
    _ready(sim)
    sim.report_launchers(lost=["job-a0-1"], spares=["job-a0-s0"])
    out = sim.step()
    st_ = sim.status
    assert st_["lastFailure"]["rung"] == "SpareSwap"
    assert st_["lastFailure"]["reason"] == "LauncherLost"
    assert st_["swaps"] == {"1": "job-a0-s0"}
    assert out.delete_pods == ["job-a0-1"] and not out.create_pods
    assert st_["restartAt"], "the backoff starts now: nothing to wait for"
    # The decision the launchers read: attempt 1, node rank 1 on the spare.
    decision = parse_decision(st_)
    assert decision is not None and decision.holder(1) == "job-a0-s0"
    # The lost pod's delete never completes (its node is gone): the release does not wait.
    made = _release(sim)
    assert made == [] and st_["restarts"] == 1
    assert sim.status["phase"] == "Running" and sim.status["restartAttempt"] == 1
    assert "job-a0-1" in sim.pods  # still deleting
    # The new spare, once the attempt trains: in the background, a new name.
    assert [p["metadata"]["name"] for p in sim.step().create_pods] == []
    sim.report_progress(5)
    assert [p["metadata"]["name"] for p in sim.step().create_pods] == ["job-a1-s0"]


def test_a_notready_node_moves_its_rank_onto_the_spare_at_once() -> None:
    """The Node's Ready condition is the second signal: with a ready spare, a pod on a NotReady
    node is lost at once, not after the operator's node-lost grace (its launcher fences itself,
    or is told to leave, before the rank starts on the spare)."""
    sim = _sim()
    sim.start_running()
    _ready(sim)
    node = sim.pods["job-a0-2"]["spec"]["nodeName"]
    sim.not_ready[node] = sim.now
    sim.step()
    st_ = sim.status
    assert st_["lastFailure"]["rung"] == "SpareSwap", st_["lastFailure"]
    assert st_["lastFailure"]["reason"] == "NodeLost"
    assert st_["swaps"] == {"2": "job-a0-s0"}
    # Without spares the grace holds: nothing yet.
    plain = _sim(spares_=0)
    plain.start_running()
    plain.not_ready[plain.pods["job-a0-2"]["spec"]["nodeName"]] = plain.now
    plain.step()
    assert plain.status["phase"] == "Running" and "lastFailure" not in plain.status


def test_node_rank_0_moves_onto_a_spare_and_the_coordinator_with_it() -> None:
    sim = _sim()
    sim.start_running()
    _ready(sim)
    # The launcher of node rank 1 took over the coordinator (term 1): it reports node rank
    # 0's launcher lost, with a majority (itself, node rank 2's and the spare's) behind it.
    sim.report_launchers(
        lost=["job-a0-0"], spares=["job-a0-s0"], coordinator="job-a0-1", term=1, attempt=0
    )
    sim.step()
    st_ = sim.status
    assert st_["lastFailure"]["rung"] == "SpareSwap", st_["lastFailure"]
    assert st_["swaps"] == {"0": "job-a0-s0"}
    assert st_["coordinator"] == {"pod": "job-a0-1", "term": 1}
    assert ("CoordinatorMoved", "the launchers' coordinator moved to pod job-a0-1 (term 1)") in (
        sim.events
    )
    _release(sim)
    assert sim.status["restartAttempt"] == 1 and "gangAttempt" in sim.status
    # The old coordinator, cut off but back, still writes term 0: not followed.
    sim.report_launchers(lost=["job-a0-2"], spares=[], coordinator="job-a0-0", term=0)
    sim.step()
    assert sim.status["restarts"] == 1
    sim.report_progress(5)
    sim.report_launchers(spares=[], coordinator="job-a0-1", term=1)
    spare = next(p for p in sim.step().create_pods)
    env = {e["name"]: e.get("value") for e in spare["spec"]["containers"][0]["env"]}
    assert env["MEGATRON_COORDINATOR_ADDR"] == sim.pods["job-a0-1"]["status"]["podIP"]


def test_without_a_ready_spare_the_ladder_is_todays() -> None:
    sim = _sim()
    sim.start_running()
    # The spare runs, but its launcher has not said it is connected: not ready.
    sim.report_launchers(lost=["job-a0-1"], spares=[])
    out = sim.step()
    assert sim.status["lastFailure"]["rung"] == "ReplacePod"
    assert out.delete_pods == ["job-a0-1"]
    # A coordinator without a majority: nothing moves either.
    sim = _sim()
    sim.start_running()
    sim.report_launchers(lost=["job-a0-0"], spares=["job-a0-s0"], quorum=False)
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "Recreate"


def test_two_lost_with_one_spare_swap_rank_0_and_replace_the_other() -> None:
    sim = _sim()
    sim.start_running()
    _ready(sim)
    sim.report_launchers(lost=["job-a0-2", "job-a0-0"], spares=["job-a0-s0"])
    sim.step()
    st_ = sim.status
    assert st_["lastFailure"]["rung"] == "ReplacePod"
    assert st_["swaps"] == {"0": "job-a0-s0"}
    sim.finish_deletions()
    made = _release(sim)
    assert made == ["job-a1-2"]


def test_a_lost_spare_is_made_again_without_a_restart() -> None:
    sim = _sim()
    sim.start_running()
    sim.fail("job-a0-s0", exit_code=137)
    out = sim.step()
    assert out.delete_pods == ["job-a0-s0"] and sim.status.get("restarts", 0) == 0
    assert any(r == "SpareLost" for r, _ in sim.events)
    sim.finish_deletions()
    sim.report_progress(3)
    assert [p["metadata"]["name"] for p in sim.step().create_pods] == ["job-a0-s0"]


def test_a_lost_spare_is_made_again_once_the_lease_shows_a_step_before_its_copy() -> None:
    # Attempt 0's records reach status.progress at most once per rate-limit window: a short
    # job would end before its first copy, its spare never made again.
    sim = _sim()
    sim.start_running()
    sim.fail("job-a0-s0", exit_code=137)
    sim.step()
    sim.finish_deletions()
    assert sim.step().create_pods == []  # nothing trains yet
    sim.progress_hold = sim.now + timedelta(seconds=60)
    sim.report_progress(1)
    assert [p["metadata"]["name"] for p in sim.step().create_pods] == ["job-a0-s0"]
    assert "progress" not in sim.status  # not copied yet: the Lease said it


def test_a_swapped_rank_lost_again_without_a_spare_goes_onto_a_pod_made_for_it() -> None:
    sim = _sim()
    sim.start_running()
    _ready(sim)
    sim.report_launchers(lost=["job-a0-1"], spares=["job-a0-s0"])
    sim.step()
    _release(sim)
    sim.report_progress(5)
    sim.step()  # the new spare job-a1-s0 is made; it is not ready yet
    sim.run_all()
    sim.report_launchers(lost=["job-a0-s0"], spares=[], attempt=1)
    sim.step()
    assert sim.status["lastFailure"]["rung"] == "ReplacePod"
    assert sim.status["swaps"] == {"1": "job-a2-1"}
    sim.finish_deletions()
    assert _release(sim) == ["job-a2-1"]


def test_sort_gang_names_each_node_rank_once() -> None:
    job = job_of({"resources.nodes": 3, "resources.spareNodes": 2, "training.globalBatchSize": 96})
    from megatron_operator.core.planner import plan

    views = [pod_view(p) for p in render_pods(job, plan(job.spec), 0)]
    gang = spares.sort_gang(views, 0, 1, 3, 2, {1: "job-a0-s0"})
    assert [(x.name, x.node_rank) for x in gang.current] == [
        ("job-a0-0", 0),
        ("job-a0-s0", 1),
        ("job-a0-2", 2),
    ]
    assert [x.name for x in gang.spares] == ["job-a0-s1"]
    assert [x.name for x in gang.displaced] == ["job-a0-1"]
    assert gang.stale == []
    # A spare beyond spec.resources.spareNodes (it was lowered while suspended) is stale.
    fewer = spares.sort_gang(views, 0, 0, 3, 1)
    assert [x.name for x in fewer.stale] == ["job-a0-s1"]


ACTIONS = st.sampled_from(["lose", "lose-spare", "ready", "unready", "progress", "tick", "crash"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(ACTIONS, st.integers(0, 3)), max_size=25))
def test_any_sequence_of_losses_names_one_pod_per_rank_and_settles(
    events: list[tuple[str, int]],
) -> None:
    """Node ranks and spares lost, spares ready or not, operator crashes, in any order: the
    status never names one pod for two node ranks nor a spare that is not a job's pod, a pod
    made for a node rank is never made while the rank has a live pod, and the job settles."""
    sim = _sim(spares_=2, maxRestarts=100)
    sim.start_running()
    for action, i in events:
        if sim.status["phase"] in ("Failed", "Succeeded"):
            break
        live = {n: p for n, p in sim.pods.items() if not p["metadata"].get("deletionTimestamp")}
        swaps = sim.status.get("swaps") or {}
        holders = {**{f"job-a0-{r}": r for r in range(3)}, **{v: int(k) for k, v in swaps.items()}}
        crash = False
        if action == "lose":
            target = next((n for n, r in holders.items() if r == i % 3 and n in live), None)
            if target is not None:
                sim.report_launchers(lost=[target], spares=_idle(sim))
        elif action == "lose-spare":
            idle = _idle(sim)
            if idle:
                sim.fail(idle[i % len(idle)], exit_code=137)
        elif action == "ready":
            sim.report_launchers(spares=_idle(sim))
        elif action == "unready":
            sim.report_launchers(spares=[], quorum=False)
        elif action == "progress" and sim.status.get("phase") == "Running":
            sim.report_progress(10 + i)
        elif action == "tick":
            sim.tick(1)
            sim.finish_deletions()
            sim.run_all()
        elif action == "crash":
            crash = True
        out = reconcile(sim.world(), sim.settings) if crash else sim.step()
        after = sim.status.get("swaps") or {}
        assert len(set(after.values())) == len(after), after
        for pod in after.values():
            assert pod.startswith("job-a"), pod
        for created in out.create_pods:
            labels = created["metadata"]["labels"]
            rank = int(labels["megatron.dev/node-rank"])
            if rank < 3 and not crash:
                held = [n for n, p in live.items() if _holds(sim, n) == rank]
                assert not held, f"node rank {rank} made again beside {held}"
    for _ in range(12):  # nothing more fails: it runs again, each node rank on one pod
        sim.report_launchers(spares=_idle(sim))
        sim.step()
        sim.finish_deletions()
        sim.run_all()
        sim.tick(1)
    if sim.status["phase"] not in ("Failed", "Succeeded"):
        assert sim.status["phase"] == "Running", sim.status
        decision = parse_decision(sim.status)
        assert decision is not None
        ranks = sorted(r for n in sim.pods if (r := _holds(sim, n)) is not None)
        assert ranks == [0, 1, 2], (ranks, sim.status.get("swaps"))


def _idle(sim: Sim) -> list[str]:
    held = set((sim.status.get("swaps") or {}).values())
    return [
        n
        for n, p in sim.pods.items()
        if "-s" in n
        and n not in held
        and not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") == "Running"
    ]


def _holds(sim: Sim, name: str) -> int | None:
    """The node rank pod `name` holds in the current decision (None: a spare, or no rank)."""
    swaps = {v: int(k) for k, v in (sim.status.get("swaps") or {}).items()}
    if name in swaps:
        return swaps[name]
    labels = sim.pods[name]["metadata"]["labels"]
    rank = int(labels["megatron.dev/node-rank"])
    if "megatron.dev/spare" in labels or str(rank) in (sim.status.get("swaps") or {}):
        return None
    attempt = int(labels["megatron.dev/restart-attempt"])
    newer = [
        n
        for n, p in sim.pods.items()
        if p["metadata"]["labels"]["megatron.dev/node-rank"] == str(rank)
        and int(p["metadata"]["labels"]["megatron.dev/restart-attempt"]) > attempt
    ]
    return None if newer else rank
