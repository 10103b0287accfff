"""Checkpoint tiers: the restore rule both sides read (megatron_contract/tiers.py), the memory
volume the operator renders and counts (core/tiers.py), and where status says each attempt
restored from."""

from __future__ import annotations

from typing import Any

import pytest

from megatron_contract import paths, tiers
from megatron_contract.env import MEMORY_CHECKPOINT_DIR
from megatron_operator.api import MegatronJobSpec, SpecError
from megatron_operator.core import render
from megatron_operator.core import tiers as job_tiers
from megatron_operator.core.jobstatus import JobStatus
from megatron_operator.core.observe import parse_progress
from megatron_operator.core.planner import plan
from megatron_operator.core.trainer_config import trainer_config

from .specs import job_of, spec_of


@pytest.mark.parametrize(
    ("memory", "all_own", "durable", "want"),
    [
        (12, True, 10, (tiers.MEMORY, 12)),  # in place: every pod's own memory
        (12, False, 10, (tiers.PEER, 12)),  # a replaced pod's ranks: the peer's copy
        (10, True, 10, (tiers.MEMORY, 10)),  # as new as the durable one: memory wins
        (9, True, 10, (tiers.DURABLE, 10)),  # older than the durable one: fall back a tier
        (None, False, 10, (tiers.DURABLE, 10)),  # a recreate: no memory left
        (None, False, None, (tiers.NONE, None)),
        (3, True, None, (tiers.MEMORY, 3)),
    ],
)
def test_the_restore_rule(
    memory: int | None, all_own: bool, durable: int | None, want: tuple[str, int | None]
) -> None:
    assert tiers.choose(memory, all_own, durable) == want


def test_each_rung_leaves_a_tier() -> None:
    assert tiers.expected("InPlace", replica=True) == tiers.MEMORY
    assert tiers.expected("ReplacePod", replica=True) == tiers.PEER
    assert tiers.expected("ReplacePod", replica=False) == tiers.DURABLE
    assert tiers.expected("Recreate", replica=True) == tiers.DURABLE
    assert tiers.expected(None, replica=True) == tiers.DURABLE


def test_replicas_go_round_the_pods() -> None:
    """Each rank's copy lives in the next pod, the last pod's in the first: with any number of
    pods (nvidia-resiliency-ext's cliques need the pods to pair up), one pod's loss leaves
    every copy but its own ranks'."""
    world, procs = 12, 4  # three pods
    targets = {r: tiers.replica_target(r, procs, world) for r in range(world)}
    assert targets[0] == 4 and targets[8] == 0 and targets[11] == 3
    for rank, target in targets.items():
        assert target // procs != rank // procs  # another pod
        assert tiers.replica_source(target, procs, world) == rank


@pytest.mark.parametrize(
    "value",
    [None, "Memory", {}, {"tier": "RAM"}, {"tier": "Memory", "step": -1}, {"tier": "Peer", "step": True},
     {"tier": "Peer", "step": 2**63}, {"tier": "Durable", "step": "3"}, [1]],
)  # fmt: skip
def test_a_hostile_restored_record_is_ignored(value: object) -> None:
    assert tiers.parse_restored(value, 2**62) is None


def test_status_keeps_where_each_attempt_restored() -> None:
    st = JobStatus()
    line = '{"attempt":%d,"iteration":%d,"time":"2026-01-01T00:00:00Z","restored":%s}'
    for attempt, restored in [(0, '{"tier":"None"}'), (1, '{"tier":"Memory","step":7}')]:
        prog = parse_progress(line % (attempt, 9, restored))
        assert prog is not None and prog.restored is not None
        job_tiers.remember(st, prog.attempt, *prog.restored)
        job_tiers.remember(st, prog.attempt, *prog.restored)  # every record carries it: once
    assert st.restores == [
        {"attempt": 0, "tier": "None"},
        {"attempt": 1, "tier": "Memory", "step": 7},
    ]
    for attempt in range(2, 40):
        job_tiers.remember(st, attempt, tiers.PEER, attempt)
    assert len(st.restores) == job_tiers.MAX_RESTORES and st.restores[-1]["attempt"] == 39
    st.restores[0]["attempt"] = "x"  # an edited status does not break the next write
    job_tiers.remember(st, 40, tiers.DURABLE, 30)


def _pod(changes: dict[str, Any]) -> tuple[Any, Any]:
    job = job_of(changes)
    p = plan(job.spec)
    return render.pod(job, p, 0, 0), trainer_config(job, p)


def test_the_pod_gets_a_memory_volume_sized_by_the_estimate() -> None:
    pod, cfg = _pod({"resources.nodes": 2})
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    memory = volumes[paths.VOLUME_MEMORY]["emptyDir"]
    assert memory["medium"] == "Memory" and memory["sizeLimit"].endswith("Mi")
    container = pod["spec"]["containers"][0]
    assert {"name": paths.VOLUME_MEMORY, "mountPath": paths.MEMORY_MOUNT} in container[
        "volumeMounts"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[MEMORY_CHECKPOINT_DIR] == paths.MEMORY_MOUNT
    m = cfg.checkpoint.memory
    assert m is not None and (m.interval, m.replica) == (1, True)


@pytest.mark.parametrize(
    "changes",
    [
        {"checkpoint.memory.interval": 0},
        {"restartPolicy.strategy": "Recreate"},  # a recreated pod keeps no memory
    ],
)
def test_no_memory_volume_where_no_pod_outlives_its_ranks(changes: dict[str, Any]) -> None:
    pod, cfg = _pod(changes)
    assert paths.VOLUME_MEMORY not in {v["name"] for v in pod["spec"]["volumes"]}
    assert cfg.checkpoint.memory is None


def test_one_pod_has_no_peer_to_copy_to() -> None:
    _, cfg = _pod({"resources.nodes": 1, "training.globalBatchSize": 64})
    assert cfg.checkpoint.memory is not None and cfg.checkpoint.memory.replica is False


def test_the_estimate_counts_snapshots_copies_two_steps_and_the_buffers() -> None:
    spec = MegatronJobSpec.model_validate(
        spec_of({"model": {"recipe": "llama3-8b"}, "resources": {"nodes": 2, "procsPerNode": 8,
                 "gpuMemoryGiB": 1000}, "training.globalBatchSize": 128,
                 "training.microBatchSize": 1})
    )  # fmt: skip
    p = plan(spec)
    assert p.memory is not None and p.training is not None
    held = job_tiers.pod_bytes(spec, p.memory, p.degrees, p.training.precision)
    assert held is not None
    # bf16 weights split over the 16 DP ranks (fully_parallel on CUDA), the fp32 main weights
    # and Adam's moments over them too: 14 bytes a parameter per DP group, ×2 copies ×2 steps
    # on the volume, and one step more in the ranks' buffers (the staged copy, the received one).
    per_rank = p.memory.parameters_per_gpu * 14 / 16
    assert 6 * 8 * per_rank < held < 6 * 8 * per_rank * 1.01 + 6 * 8 * 2**24
    volume = job_tiers.volume_bytes(spec, p.memory, p.degrees, p.training.precision)
    assert volume is not None and volume * 3 == held * 2


def test_a_pod_limit_below_the_tiers_is_refused_naming_the_field() -> None:
    spec = spec_of({"model": {"recipe": "llama3-8b"}, "resources": {"nodes": 2, "procsPerNode": 8,
                    "gpuMemoryGiB": 1000, "limits": {"memory": "64Gi"}},
                    "training.globalBatchSize": 128, "training.microBatchSize": 1})  # fmt: skip
    with pytest.raises(SpecError) as err:
        plan(MegatronJobSpec.model_validate(spec))
    (problem,) = err.value.errors
    assert problem.path == "spec.checkpoint.memory"
    assert "resources.limits.memory" in problem.message and "64Gi" in problem.message
    # With the tiers off there is nothing to hold.
    for change in ({"checkpoint.memory.interval": 0},):
        ok = spec_of({**change, "model": {"recipe": "llama3-8b"}, "resources": {"nodes": 2,
                      "procsPerNode": 8, "gpuMemoryGiB": 1000, "limits": {"memory": "64Gi"}},
                      "training.globalBatchSize": 128, "training.microBatchSize": 1})  # fmt: skip
        plan(MegatronJobSpec.model_validate(ok))
