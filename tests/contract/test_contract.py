"""The operator ↔ trainer contract (docs/contract.md), checked from both sides.

The facts both sides need live once, in `megatron_contract`. This test is where the two sides meet:
it renders pods with the operator's renderer and feeds their env and config to the trainer's
parser and validator, and checks that exit codes and the progress report mean the same to the
operator as to the trainer.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.config import load_config, load_launch_config
from megatron_contract.env import RESERVED as RESERVED_ENV
from megatron_contract.env import runtime_env
from megatron_contract.errors import ConfigError
from megatron_contract.exitcodes import ExitCode
from megatron_contract.paths import PROGRESS_ANNOTATION
from megatron_contract.timeline import Clock
from megatron_operator.api import load_file
from megatron_operator.api.spec import RestartPolicySpec
from megatron_operator.core.observe import parse_progress
from megatron_operator.core.planner import plan
from megatron_operator.core.policy import Failure, match
from megatron_operator.core.render import render
from megatron_trainer.progress import Report
from megatron_trainer.validate import validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """The env a kubelet would give the container (downward API resolved)."""
    env: dict[str, str] = {}
    for item in pod["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = (
                pod["metadata"]["name"]
                if field == "metadata.name"
                else pod["metadata"]["namespace"]
            )
    return env


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_rendered_pods_parse_and_validate_in_the_trainer(path: Path, tmp_path: Path) -> None:
    job = load_file(path)
    p = plan(job.spec)
    objs = render(job, p, attempt=2)
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    config_file = tmp_path / "config.json"
    config_file.write_text(cm["data"]["config.json"])
    launch = load_launch_config(config_file)  # what the launcher reads, whatever the code
    if job.spec.trainer is not None:
        assert (
            launch.trainer is not None and list(launch.trainer.command) == job.spec.trainer.command
        )
        assert launch.checkpoint.dir == f"/mnt/checkpoints/{job.name}"
        return
    cfg = load_config(config_file)
    pods = [o for o in objs if o["kind"] == "Pod"]
    for pod in (pods[0], pods[-1]):
        env = _pod_env(pod)
        env["MEGATRON_CONFIG"] = str(config_file)
        rt = runtime_env(env)
        assert rt.world_size == p.world_size
        assert rt.nnodes == p.nodes and rt.nproc_per_node == p.procs_per_node
        assert rt.node_rank == int(pod["metadata"]["labels"]["megatron.dev/node-rank"])
        assert rt.restart_attempt == 2
        # The Lease the trainer writes is the one the operator creates and its Role names.
        lease = next(o for o in objs if o["kind"] == "Lease")["metadata"]["name"]
        role = next(o for o in objs if o["kind"] == "Role")
        assert rt.progress_lease == lease == f"{job.name}-progress"
        assert role["rules"][0]["resourceNames"] == [lease]
        assert cfg.progress.annotation == PROGRESS_ANNOTATION  # the record's key on the Lease
        # Ranks contiguous per pod: the trainer's global rank matches the planner's node map.
        for local in range(rt.nproc_per_node):
            assert p.coord(rt.global_rank(local)).node == rt.node_rank
        validate(cfg, rt, check_paths=False)  # raises ConfigError with every problem
    assert cfg.parallelism.data == p.degrees.dp
    assert p.model is not None and cfg.model.padded_vocab_size == p.model.padded_vocab_size


def test_exit_codes_mean_to_the_operator_what_the_trainer_means() -> None:
    rules: list[Any] = list(RestartPolicySpec().rules)
    assert match(Failure("Error", ExitCode.CONFIG), rules)[0] == "Fail"
    assert match(Failure("Error", ExitCode.SIGTERM), rules)[0] == "RestartNotCounted"
    assert match(Failure("Error", ExitCode.NON_FINITE), rules)[0] == "Fail"
    assert match(Failure("Error", 1), rules)[0] == "Restart"


def test_progress_report_parses_in_the_operator() -> None:
    when = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    text = Report(120, 3.2143, 51234.5, 0.41, 100).to_json(2, when)
    parsed = parse_progress(text)
    assert parsed is not None
    assert parsed.attempt == 2
    assert (parsed.iteration, parsed.loss, parsed.checkpoint_iteration) == (120, 3.2143, 100)
    assert parsed.tokens_per_second == 51234.5 and parsed.mfu == 0.41
    assert parsed.time == when
    assert set(json.loads(text)) == {
        "attempt",
        "iteration",
        "loss",
        "tokensPerSecond",
        "mfu",
        "checkpointIteration",
        "time",
    }
    # A diverged loss is null, which the operator accepts.
    assert parse_progress(Report(5, float("nan"), None, None, None).to_json(0, when)) is not None


def test_the_trainers_timeline_reaches_the_operator_whole() -> None:
    """The progress record's `clock` (the goodput ledger's facts), as the trainer writes it and
    the operator reads it; an older operator ignores the key, an older trainer omits it."""
    when = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    clock = Clock(
        now=when.timestamp() + 0.25,
        began=when.timestamp() - 60.5,
        loop=when.timestamp() - 20.125,
        start=100,
        rendezvous=3.5,
        load=12.25,
        save=1.5,
    )
    text = Report(120, 3.2, None, None, 100, clock).to_json(2, when)
    parsed = parse_progress(text)
    assert parsed is not None and parsed.clock == clock
    assert len(json.loads(text)["clock"]) == 7 and len(text) < 300
    assert parse_progress(Report(120, 3.2, None, None, 100).to_json(2, when)).clock is None  # type: ignore[union-attr]


def test_the_renderer_sets_exactly_the_reserved_env() -> None:
    job = load_file(ROOT / "examples" / "cpu-tiny.yaml")
    pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
    names = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert names <= RESERVED_ENV
    # Set only by mjob run --local, where there is no apiserver: PROGRESS_FILE, and the
    # restart ladder's status and report files; SCRATCH: only with checkpoint.url (below); the
    # data and init directories only with their volumes (below).
    local_only = {"MEGATRON_PROGRESS_FILE", "MEGATRON_STATUS_FILE", "MEGATRON_REPORT_FILE"}
    dirs = {"MEGATRON_DATA_DIR", "MEGATRON_INIT_DIR"}
    # Only with resources.spareNodes (below): the spares' count and number, and where the
    # coordinator listens once it moved.
    spare = {"MEGATRON_SPARE_NODES", "MEGATRON_SPARE_INDEX", "MEGATRON_COORDINATOR_ADDR"}
    assert RESERVED_ENV - names == {*local_only, *dirs, *spare, "MEGATRON_SCRATCH"}
    volumes = load_file(
        ROOT / "examples" / "cpu-tiny.yaml",
        [
            "data.volume.claimName=data",
            "checkpoint.init.volume.claimName=weights",
            "checkpoint.init.huggingFace.path=/mnt/init/llama",
        ],
    )
    with_volumes = next(o for o in render(volumes, plan(volumes.spec)) if o["kind"] == "Pod")
    names = {e["name"] for e in with_volumes["spec"]["containers"][0]["env"]}
    assert RESERVED_ENV - names == {*local_only, *spare, "MEGATRON_SCRATCH"}
    job = load_file(ROOT / "examples" / "llama3-8b-auto.yaml")  # msc:// and a data claim
    pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert RESERVED_ENV - set(env) == {*local_only, *spare, "MEGATRON_INIT_DIR"}
    # MSC's own variable, last: the mounted Secret wins over any spec.env entry of that name.
    assert list(env)[-2:] == ["MSC_CONFIG", "MEGATRON_SCRATCH"]
    assert env["MSC_CONFIG"] == "/etc/megatron-msc/msc_config.yaml"


def test_a_spare_pod_parses_as_a_spare_and_an_older_launcher_refuses_it() -> None:
    """A spare's NODE_RANK is its index among the job's pods (NNODES + its number): the launcher
    reads it as a spare; a launcher that knows no spares (the check below) refuses it, so an old
    image never runs a spare as a rank."""
    job = load_file(
        ROOT / "examples" / "cpu-tiny.yaml",
        [
            "resources.nodes=2",
            "resources.spareNodes=2",
            "training.globalBatchSize=8",
            "checkpoint.volume.create.accessModes=[ReadWriteMany]",
        ],
    )
    pods = [o for o in render(job, plan(job.spec)) if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == [
        "cpu-tiny-a0-0", "cpu-tiny-a0-1", "cpu-tiny-a0-s0", "cpu-tiny-a0-s1"
    ]  # fmt: skip
    gang = [runtime_env(_pod_env(p)) for p in pods]
    assert [(e.node_rank, e.spare, e.spare_nodes) for e in gang] == [
        (0, None, 2), (1, None, 2), (2, 0, 2), (3, 1, 2)
    ]  # fmt: skip
    assert pods[2]["metadata"]["labels"]["megatron.dev/spare"] == "0"
    assert pods[2]["spec"]["hostname"] == "cpu-tiny-s0"
    spare_env = _pod_env(pods[3])
    older = {k: v for k, v in spare_env.items() if k != "MEGATRON_SPARE_INDEX"}
    with pytest.raises(ConfigError, match="NODE_RANK"):
        runtime_env(older)
    with pytest.raises(ConfigError, match="MEGATRON_SPARE_INDEX"):
        runtime_env({**spare_env, "MEGATRON_SPARE_INDEX": "2"})


def test_keep_zero_means_keep_all_on_both_sides(tmp_path: Path) -> None:
    job = load_file(ROOT / "examples" / "cpu-tiny.yaml", ["checkpoint.keep=0"])
    cm = next(o for o in render(job, plan(job.spec)) if o["kind"] == "ConfigMap")
    (tmp_path / "c.json").write_text(cm["data"]["config.json"])
    assert load_config(tmp_path / "c.json").checkpoint.keep == 0


def test_the_launchers_view_has_the_trainers_fields() -> None:
    # One document, two readers: the built-in trainer's (every section) and the launcher's (model,
    # training and data may be null with a trainer.command). Their fields must not drift apart.
    import dataclasses

    from megatron_contract.config import LaunchConfig, TrainerConfig

    assert [f.name for f in dataclasses.fields(LaunchConfig)] == [
        f.name for f in dataclasses.fields(TrainerConfig)
    ]


# --- the restart ladder (docs/contract.md §5) ---------------------------------------------------
def test_the_ladder_vocabulary_is_the_operators() -> None:
    from typing import get_args

    from megatron_contract import ladder
    from megatron_operator.api.spec import RestartStrategy
    from megatron_operator.api.status import Phase
    from megatron_operator.core.jobstatus import JobStatus

    assert ladder.PHASE_RESTARTING == Phase.RESTARTING
    assert set(ladder.PHASES_ENDED) == {Phase.SUCCEEDED, Phase.FAILED}
    assert get_args(RestartStrategy) == ladder.STRATEGIES
    # The status keys the coordinator reads are the ones the operator writes.
    raw = JobStatus(phase=Phase.RESTARTING, restart_attempt=3).to_raw()
    assert raw[ladder.STATUS_RESTART_ATTEMPT] == 3 and raw[ladder.STATUS_PHASE] == "Restarting"


def test_a_rendered_pod_runs_its_launcher_in_place_with_the_coordinator_port() -> None:
    from megatron_contract.ladder import DEFAULT_COORDINATOR_PORT, IN_PLACE

    job = load_file(ROOT / "examples" / "cpu-tiny.yaml")
    pod = next(o for o in render(job, plan(job.spec)) if o["kind"] == "Pod")
    env = runtime_env(_pod_env(pod))
    assert (env.restart_strategy, env.coordinator_port) == (IN_PLACE, DEFAULT_COORDINATOR_PORT)
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["coordinator"] == DEFAULT_COORDINATOR_PORT
    recreate = load_file(ROOT / "examples" / "cpu-tiny.yaml", ["restartPolicy.strategy=Recreate"])
    pod = next(o for o in render(recreate, plan(recreate.spec)) if o["kind"] == "Pod")
    assert runtime_env(_pod_env(pod)).restart_strategy == "Recreate"


def test_the_launchers_report_reads_back_and_garbage_reads_as_none() -> None:
    from megatron_contract.ladder import (
        MAX_FAILURES,
        MAX_REPORT_CHARS,
        LostLauncher,
        RankFailure,
        Report,
        parse_report,
    )
    from megatron_operator.core.observe import lease_view

    report = Report(
        attempt=4,
        nodes=3,
        started=3,
        started_at="2026-11-25T19:34:03.952095Z",
        seen_at="2026-11-25T19:34:03.876850Z",
        failures=(RankFailure(1, 0, 137, "t1"), RankFailure(2, 1, 1, "t2")),
        lost=(LostLauncher(2, "job-a0-2", "t3"),),
    )
    assert parse_report(report.dumps()) == report
    lease = {"metadata": {"annotations": {"megatron.dev/launchers": report.dumps()}}}
    view = lease_view(lease)
    assert view is not None and view.report == report
    too_many = Report(0, 1, failures=tuple(RankFailure(0, i, 1, "t") for i in range(99)))
    parsed = parse_report(too_many.dumps())
    assert parsed is not None and len(parsed.failures) == MAX_FAILURES
    for garbage in (
        None,
        5,
        "",
        "{",
        "[]",
        "x" * (MAX_REPORT_CHARS + 1),
        "[" * 100_000,
        '{"attempt": -1, "nodes": 1}',
        '{"attempt": true, "nodes": 1}',
        '{"attempt": "3", "nodes": 1}',
        '{"attempt": 1e400, "nodes": 1}',
        '{"attempt": 99999999999999999999, "nodes": 1}',
    ):
        assert parse_report(garbage) is None, garbage
    # Bad entries are dropped one by one; the rest is kept.
    mixed = json.loads(report.dumps())
    mixed["failures"] += [{"nodeRank": "1"}, None, {"nodeRank": 0, "localRank": 0, "exitCode": 999}]
    mixed["lost"].append({"nodeRank": 1, "pod": "x" * 300, "time": "t"})
    assert parse_report(json.dumps(mixed)) == report
