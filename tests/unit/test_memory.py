"""The memory estimate of Megatron FSDP (core/memory.py): what it shards, what it does not, and
the moment before it shards."""

from __future__ import annotations

from typing import Any

from megatron_operator.api import MegatronJobSpec
from megatron_operator.core.memory import GIB
from megatron_operator.core.planner import Plan, plan

from .specs import spec_of


def _plan(nodes: int, fsdp: bool, **model: Any) -> Plan:
    spec = spec_of(
        {
            "model": {"recipe": "llama3-8b", **model},
            "resources": {"nodes": nodes, "procsPerNode": 8, "gpuMemoryGiB": 1000},
            "training.globalBatchSize": 64 * nodes,
            "training.microBatchSize": 1,
            "parallelism": {"fsdp": fsdp},
        }
    )
    return plan(MegatronJobSpec.model_validate(spec))


def test_fsdp_keeps_the_embedding_and_output_unsharded() -> None:
    """Units are transformer layers: the embedding and output layer (Llama-3 8B: 2 × 128,256 ×
    4096, untied) stay gathered with their gradients (2 + 4 bytes in bf16) through each step."""
    p = _plan(1, fsdp=True)
    assert p.model is not None and p.memory is not None
    vocab = 2 * p.model.padded_vocab_size * p.model.hidden_size
    m = p.memory
    sharded = m.parameters_total * 18 / 8  # bf16 weights, fp32 grads, master, m, v over 8
    assert m.weights_and_optimizer_gib * GIB > sharded + vocab * 6
    # ... so more ranks shrink the rest, not that.
    big = _plan(8, fsdp=True).memory
    assert big is not None
    assert big.weights_and_optimizer_gib * GIB > vocab * 6


def test_fsdp_counts_the_whole_model_it_builds_before_sharding() -> None:
    """Every rank builds all its parameters before Megatron FSDP shards them (no meta-device
    init): at 64 ranks and 1024 tokens a GPU that moment is the peak, not training."""
    m = _plan(8, fsdp=True, seqLength=1024).memory
    assert m is not None
    assert m.construction_gib * GIB >= m.parameters_total * 2  # bf16, unsharded
    assert m.construction_gib > m.weights_and_optimizer_gib + m.activations_gib
    assert m.per_gpu_gib == m.construction_gib + m.overhead_gib
    ddp = _plan(8, fsdp=False, seqLength=1024).memory
    assert ddp is not None and ddp.construction_gib == 0.0  # the DDP path shards nothing
