"""The layout cost model (core/cost.py) term by term: each term moves the way its physics says
when one degree, one link or one schedule changes, and nothing else does. The ranking of the
published layouts is in test_layouts.py; these tests pin why it comes out that way."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from megatron_contract.config import ModelConfig, TrainingConfig
from megatron_operator.api import MegatronJobSpec
from megatron_operator.core.cost import H100, HIDDEN_COST, TIGHT_COST, Cost, step_cost
from megatron_operator.core.memory import ParallelDegrees
from megatron_operator.core.planner import plan

from .specs import spec_of


def _planned(
    recipe: str, nodes: int, parallelism: dict[str, Any], gbs: int, **training: Any
) -> tuple[ModelConfig, ParallelDegrees, TrainingConfig]:
    spec = MegatronJobSpec.model_validate(
        spec_of(
            {
                "model.recipe": recipe,
                "resources": {"nodes": nodes, "procsPerNode": 8, "gpuMemoryGiB": 4096.0},
                "parallelism": parallelism,
                "training.globalBatchSize": gbs,
                "training.microBatchSize": 1,
                **{f"training.{k}": v for k, v in training.items()},
            }
        )
    )
    p = plan(spec)
    return p.model, p.degrees, p.training


def _terms(c: Cost) -> dict[str, float]:
    return {t.name: t.share for t in c.terms}


def _why(c: Cost, name: str) -> str:
    return next(t.why for t in c.terms if t.name == name)


def test_the_ideal_is_one_and_terms_add_up() -> None:
    """One GPU, no parallelism: only the compute term (full-size GEMMs at seq 8192) remains, and
    the relative step time is 1 plus the sum of the terms."""
    m, d, t = _planned("llama3-8b", 1, {}, 8)
    d = dataclasses.replace(d, dp=1, edp=1)
    c = step_cost(m, d, t, 8)
    assert set(_terms(c)) == {"compute"}
    assert c.relative_step_time == pytest.approx(1.0 + sum(_terms(c).values()))
    assert c.relative_step_time == pytest.approx(1.0, abs=1e-9)


def test_tensor_parallel_collectives_grow_with_tp_and_sequence_parallel_exposes_more() -> None:
    m, d, t = _planned("llama3-70b", 4, {"tensor": 2, "pipeline": 4}, 512)
    shares = []
    for tp in (2, 4, 8):
        c = step_cost(m, dataclasses.replace(d, tp=tp), t, 8)
        shares.append(_terms(c)["tensor"])
    assert shares == sorted(shares) and shares[0] > 0
    with_sp = _terms(step_cost(m, dataclasses.replace(d, tp=8, sequence_parallel=True), t, 8))
    without = _terms(step_cost(m, dataclasses.replace(d, tp=8, sequence_parallel=False), t, 8))
    # With SP: 3 of 5 units a block exposed (+ the hidden 2 at HIDDEN_COST); without: 2 of 4.
    ratio = (3 + 2 * HIDDEN_COST) / (2 + 2 * HIDDEN_COST)
    assert with_sp["tensor"] / without["tensor"] == pytest.approx(ratio)


def test_pipeline_bubble_shrinks_with_virtual_stages_and_microbatches() -> None:
    m, d, t = _planned("llama3-70b", 4, {"tensor": 4, "pipeline": 4}, 64)
    shares = []
    for vpp in (None, 2, 5, 10):
        c = step_cost(m, dataclasses.replace(d, vpp=vpp), t, 8)
        shares.append(_terms(c)["pipeline"])
        assert f"VPP{vpp or 1}·{t.num_microbatches} microbatches" in c.why()
    assert shares == sorted(shares, reverse=True)
    more = dataclasses.replace(t, num_microbatches=4 * t.num_microbatches)
    assert _terms(step_cost(m, d, more, 8))["pipeline"] < shares[0]
    # No pipeline, no bubble.
    assert "pipeline" not in _terms(step_cost(m, dataclasses.replace(d, pp=1, vpp=None), t, 8))


def test_expert_all_to_all_costs_more_once_it_leaves_the_node() -> None:
    m, d, t = _planned("mixtral-8x7b", 8, {"pipeline": 4, "expert": 8}, 256)
    inside = _terms(step_cost(m, d, t, 8))["expert"]
    across = _terms(step_cost(m, d, t, 4))["expert"]  # 4 GPUs a node: EP8 spans two
    assert across > 2 * inside
    assert "NVLink and the network" in _why(step_cost(m, d, t, 4), "expert")
    # A faster network closes the gap: the term is a transfer time, not a constant.
    fast = dataclasses.replace(H100, network_bytes_per_s=H100.nvlink_bytes_per_s)
    assert _terms(step_cost(m, d, t, 4, hw=fast))["expert"] < across


def test_context_ring_hides_behind_long_attention_and_shows_on_the_network() -> None:
    m, d, t = _planned("llama3-8b", 1, {"context": 2}, 128)
    nvlink = step_cost(m, d, t, 8)
    # At seq 8192 the ring step hides behind the attention: only HIDDEN_COST of it shows.
    assert "hidden behind attention" in _why(nvlink, "context")
    slow = dataclasses.replace(H100, network_bytes_per_s=H100.network_bytes_per_s / 100)
    network = step_cost(m, d, t, 1, hw=slow)  # one GPU a node: the ring crosses nodes
    assert "partly exposed" in _why(network, "context")
    assert _terms(network)["context"] > 10 * _terms(nvlink)["context"]


def test_data_parallel_reduce_overlaps_the_backward_pass_fsdp_pays_each_microbatch() -> None:
    m, d, t = _planned("llama3-8b", 4, {}, 128)  # DP32 over 4 nodes
    dp = _terms(step_cost(m, d, t, 8))["data"]
    # Many microbatches: the once-a-step reduce hides behind the last backward pass, and what
    # is left is the HIDDEN_COST share; one microbatch a step exposes it.
    one = dataclasses.replace(t, num_microbatches=1)
    assert _terms(step_cost(m, d, one, 8))["data"] > dp * t.num_microbatches / 2
    fsdp = _terms(step_cost(m, dataclasses.replace(d, fsdp=True), t, 8))["data"]
    assert fsdp > dp
    # Inside one node the same reduce is over NVLink and costs less.
    m1, d1, t1 = _planned("llama3-8b", 1, {}, 32)
    d1 = dataclasses.replace(d1, fsdp=True)
    fsdp_nvlink = _terms(step_cost(m1, d1, t1, 8))["data"]
    assert "over NVLink" in _why(step_cost(m1, d1, t1, 8), "data")
    assert fsdp_nvlink < fsdp


def test_recompute_costs_by_what_it_repeats() -> None:
    m, d, t = _planned("llama3-70b", 4, {"tensor": 4, "pipeline": 4}, 512)
    costs = [
        step_cost(m, d, dataclasses.replace(t, recompute=r), 8).relative_step_time
        for r in ("none", "selective", "full")
    ]
    assert costs[0] < costs[1] < costs[2]
    # Full recompute repeats the forward: about a third of the layers' work, and more, since
    # the forward's collectives run again.
    assert costs[2] - costs[0] > 0.3


def test_thin_gemms_lose_efficiency() -> None:
    """Context parallelism below 4096 tokens a GPU and tensor parallelism that shrinks the weights
    below 4096 wide slow the GEMMs."""
    m, d, t = _planned("llama3-8b", 1, {}, 8)
    base = _terms(step_cost(m, d, t, 8))["compute"]
    cp8 = _terms(step_cost(m, dataclasses.replace(d, cp=8), t, 8))["compute"]
    tp8 = _terms(step_cost(m, dataclasses.replace(d, tp=8), t, 8))["compute"]
    assert base == 0.0 and cp8 > tp8 > 0.0


def test_tight_memory_is_a_risk_term() -> None:
    m, d, t = _planned("llama3-8b", 1, {}, 8)
    assert _terms(step_cost(m, d, t, 8, tight=True))["memory"] == TIGHT_COST
