"""The layout rules (Megatron-Core 0.16.1's validity rules, and this trainer's platform limits),
over the resolved config. Written once: the operator's planner runs them on the spec before any GPU
is allocated, and the trainer runs them again on the config it is given.

Each problem names the spec field to change (relative to `spec`) and says why. `divisors_of` lets
the planner add a "use 1, 2, 4 or 8" hint; `divisors` computes it in O(√n), so no spec, however
large its numbers, makes the hint slow. The CRD's CEL rules (`megatron_operator.api.cel`) are the
one second copy, checked against these by `tests/unit/test_rules.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from megatron_contract.choices import CPU, NSYS
from megatron_contract.config import (
    DataConfig,
    ModelConfig,
    ParallelismConfig,
    ProfilingConfig,
    ResourcesConfig,
    TrainerConfig,
    TrainingConfig,
)


@dataclass(frozen=True)
class Problem:
    field: str  # the spec field to change, e.g. "parallelism.tensor"
    message: str
    divisors_of: int | None = None  # the valid values are the divisors of this number
    divisors_below: int | None = None  # ... up to this bound

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Layout:
    """What the rules look at: the config without the job's identity and checkpoint plumbing."""

    model: ModelConfig
    parallelism: ParallelismConfig
    training: TrainingConfig
    data: DataConfig
    resources: ResourcesConfig
    profiling: ProfilingConfig | None


def divisors(n: int, limit: int | None = None, count: int = 64) -> list[int]:
    """The divisors of n (at most `count`, the smallest first), in O(√n)."""
    if n < 1:
        return []
    small: list[int] = []
    large: list[int] = []
    # Capped, so a huge n cannot stall the caller; the divisors found are still all valid.
    i, last = 1, min(math.isqrt(n), 1_000_000)
    while i <= last and len(small) < count:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    found = sorted(set(small + large))
    if limit is not None:
        found = [d for d in found if d <= limit]
    return found[:count]


def default_sequence_parallel(tensor: int, accelerator: str) -> bool:
    """sequenceParallel when the spec leaves it unset: on with tensor parallelism on GPUs.

    Megatron's guidance is to always use it with TP > 1: without it the LayerNorm and dropout
    activations (about 6·s·b·h bytes a layer) are duplicated on every tensor-parallel rank. The
    CPU platform has no Transformer Engine, which sequence parallelism needs, so it stays off
    there. An explicit value always wins (the CEL has the same expression)."""
    return tensor > 1 and accelerator != CPU


def _layout(lay: Layout) -> Iterator[Problem]:
    p, r = lay.parallelism, lay.resources
    world = r.nodes * r.procs_per_node
    if r.procs_per_node % p.tensor:
        yield Problem(
            "parallelism.tensor",
            f"tensor ({p.tensor}) must divide resources.procsPerNode ({r.procs_per_node}) so that "
            "each tensor-parallel group stays inside one node",
            divisors_of=r.procs_per_node,
        )
    if world % p.model_parallel:
        yield Problem(
            "parallelism",
            f"tensor × pipeline × context ({p.model_parallel}) must divide resources.nodes × "
            f"resources.procsPerNode ({world}): change the degrees or the number of nodes",
        )
    elif p.data != world // p.model_parallel:
        yield Problem(
            "parallelism.data",
            f"data ({p.data}) must be world / (tensor × pipeline × context) = "
            f"{world // p.model_parallel}",
        )


def _tensor(lay: Layout) -> Iterator[Problem]:
    m, tp, sp = lay.model, lay.parallelism.tensor, lay.parallelism.sequence_parallel
    if m.num_attention_heads % tp:
        yield Problem(
            "parallelism.tensor",
            f"numAttentionHeads ({m.num_attention_heads}) is not divisible by parallelism.tensor "
            f"({tp})",
            divisors_of=m.num_attention_heads,
        )
    g = m.num_query_groups
    if m.num_attention_heads % g:
        yield Problem(
            "model.numQueryGroups",
            f"numAttentionHeads ({m.num_attention_heads}) must be a multiple of numQueryGroups "
            f"({g})",
            divisors_of=m.num_attention_heads,
        )
    elif g % tp and tp % g:
        choices = sorted({*divisors(g, count=16), g * 2, g * 4, g * 8})
        yield Problem(
            "parallelism.tensor",
            f"numQueryGroups ({g}) and parallelism.tensor ({tp}) must divide one another: use a "
            f"tensor size among {', '.join(map(str, choices))}",
        )
    if m.ffn_hidden_size % tp:
        yield Problem(
            "parallelism.tensor",
            f"ffnHiddenSize ({m.ffn_hidden_size}) is not divisible by parallelism.tensor ({tp})",
            divisors_of=m.ffn_hidden_size,
            divisors_below=64,
        )
    if sp and tp == 1:
        yield Problem(
            "parallelism.sequenceParallel",
            "sequenceParallel needs parallelism.tensor > 1: set tensor ≥ 2 or turn it off",
        )
    cp, seq = lay.parallelism.context, m.seq_length
    if sp and tp > 1 and seq % cp == 0 and (seq // cp) % tp:
        # Megatron-Core scatters each context-parallel rank's sequence over the tensor ranks
        # (tensor_parallel.mappings `_split_along_first_dim` asserts it divides).
        yield Problem(
            "parallelism.sequenceParallel",
            f"sequence parallelism splits each context-parallel rank's {seq // cp} tokens "
            f"(model.seqLength {seq} / context {cp}) over tensor ({tp}) ranks, which must divide "
            "them: change model.seqLength or parallelism.tensor, or turn sequenceParallel off",
        )
    if m.moe is not None and tp > 1 and not sp:
        yield Problem(
            "parallelism.sequenceParallel",
            f"MoE models with tensor parallelism ({tp}) need sequenceParallel: true",
        )


def _pipeline(lay: Layout) -> Iterator[Problem]:
    m, p = lay.model, lay.parallelism
    pp, vpp = p.pipeline, p.virtual_pipeline
    if m.num_layers % pp:
        yield Problem(
            "parallelism.pipeline",
            f"numLayers ({m.num_layers}) is not divisible by parallelism.pipeline ({pp})",
            divisors_of=m.num_layers,
        )
    if vpp is None or vpp == 1:
        return  # one model chunk per stage: not interleaved
    if pp == 1:
        yield Problem(
            "parallelism.virtualPipeline",
            "virtualPipeline > 1 needs parallelism.pipeline > 1: remove it or raise pipeline",
        )
    elif m.num_layers % (pp * vpp):
        per_rank = m.num_layers // pp if m.num_layers % pp == 0 else None
        yield Problem(
            "parallelism.virtualPipeline",
            f"numLayers ({m.num_layers}) must split into pipeline × virtualPipeline ({pp} × {vpp}) "
            "equal stages" + ("" if per_rank else ": fix pipeline first"),
            divisors_of=per_rank,
        )


def _fsdp(lay: Layout) -> Iterator[Problem]:
    """Megatron FSDP (use_megatron_fsdp) shards parameters, gradients and optimizer state over
    the data-parallel (× context) ranks. Megatron-Core combines it with TP, CP and EP, but its
    schedule has no pipeline: Megatron-LM's arguments.py asserts pipeline size 1."""
    p = lay.parallelism
    if p.fsdp and p.pipeline > 1:
        yield Problem(
            "parallelism.fsdp",
            f"Megatron FSDP does not combine with pipeline parallelism (pipeline {p.pipeline}): "
            "set pipeline: 1 (FSDP already shards the layers over the data-parallel ranks) or "
            "fsdp: false",
        )


def _experts(lay: Layout) -> Iterator[Problem]:
    m, p = lay.model, lay.parallelism
    ep, etp = p.expert, p.expert_tensor
    world = lay.resources.nodes * lay.resources.procs_per_node
    if ep > 1 and m.moe is None:
        yield Problem("parallelism.expert", f"expert ({ep}) > 1 needs an MoE model (model.moe)")
    if m.moe is not None:
        n = m.moe.num_experts
        if n % ep:
            yield Problem(
                "parallelism.expert",
                f"model.moe.numExperts ({n}) is not divisible by parallelism.expert ({ep})",
                divisors_of=n,
            )
        if m.moe.router_top_k > n:
            yield Problem(
                "model.moe.routerTopK",
                f"routerTopK ({m.moe.router_top_k}) exceeds numExperts ({n})",
            )
        if m.moe.ffn_hidden_size % etp:
            yield Problem(
                "parallelism.expertTensor",
                f"model.moe.ffnHiddenSize ({m.moe.ffn_hidden_size}) is not divisible by "
                f"expertTensor ({etp})",
            )
        if m.moe.first_k_dense_layers >= m.num_layers:
            # Megatron-Core's layer-frequency pattern needs at least one MoE layer.
            yield Problem(
                "model.moe.firstKDenseLayers",
                f"firstKDenseLayers ({m.moe.first_k_dense_layers}) must be below numLayers "
                f"({m.num_layers}): an MoE model needs at least one MoE layer",
            )
    if m.moe is None and ep == 1:
        return  # a dense model's expert groups mirror its tensor groups: nothing more to check
    # With tensor × pipeline × context dividing the world, this is the same as "expertTensor ×
    # expert divides tensor × context × data", Megatron's other form of the rule.
    if world % (etp * ep * p.pipeline):
        yield Problem(
            "parallelism.expert",
            f"expertTensor × expert × pipeline ({etp} × {ep} × {p.pipeline}) must divide the world "
            f"size ({world})",
        )
    elif p.expert_data != world // (etp * ep * p.pipeline):
        yield Problem(
            "parallelism.expert",
            f"expertData ({p.expert_data}) must be world / (expertTensor × expert × pipeline) = "
            f"{world // (etp * ep * p.pipeline)}",
        )


def _sequence(lay: Layout) -> Iterator[Problem]:
    m, cp = lay.model, lay.parallelism.context
    if cp > 1 and m.seq_length % (2 * cp):
        yield Problem(
            "parallelism.context",
            f"model.seqLength ({m.seq_length}) must be divisible by 2 × context ({2 * cp}) for "
            "load-balanced context parallelism",
        )
    if m.max_position_embeddings < m.seq_length:
        yield Problem(
            "model.maxPositionEmbeddings",
            f"maxPositionEmbeddings ({m.max_position_embeddings}) is below seqLength "
            f"({m.seq_length}): raise it or shorten the sequence",
        )
    if m.mla is not None and m.position_embedding != "rope":
        yield Problem("model.positionEmbedding", "multi-latent attention (model.mla) needs rope")
    tp = lay.parallelism.tensor
    if m.padded_vocab_size < m.vocab_size or m.padded_vocab_size % tp:
        yield Problem(
            "model.vocabSize",
            f"the padded vocabulary ({m.padded_vocab_size}) must be at least vocabSize "
            f"({m.vocab_size}) and divisible by tensor ({tp})",
        )


def _platform(lay: Layout) -> Iterator[Problem]:
    if lay.resources.accelerator != CPU:
        return
    p, t, m = lay.parallelism, lay.training, lay.model
    cuda = "or resources.accelerator: nvidia.com/gpu"
    if p.context > 1:
        yield Problem(
            "parallelism.context",
            f"context parallelism is CUDA-only (it needs Transformer Engine attention): set "
            f"context: 1 {cuda}",
        )
    if p.fsdp:
        yield Problem(
            "parallelism.fsdp",
            "Megatron FSDP is CUDA-only in Megatron-Core 0.16.1 (it creates CUDA streams for its "
            f"parameter gathers): set fsdp: false {cuda}",
        )
    if lay.profiling is not None and lay.profiling.tool == NSYS:
        yield Problem(
            "profiling.tool",
            f"nsys (Nsight Systems) profiles CUDA: use tool torch or viztracer on CPU {cuda}",
        )
    if p.sequence_parallel:
        yield Problem(
            "parallelism.sequenceParallel",
            "sequence parallelism needs Transformer Engine, which the CPU platform does not have: "
            f"turn it off (MoE on CPU then needs tensor: 1) {cuda}",
        )
    if t.precision != "fp32":
        yield Problem(
            "training.precision",
            f"{t.precision} needs a GPU; with resources.accelerator: none use fp32",
        )
    if m.moe is not None and m.moe.token_dispatcher != "allgather":
        yield Problem(
            "model.moe.tokenDispatcher",
            f"the {m.moe.token_dispatcher} dispatcher is CUDA-only in Megatron-Core 0.16.1 (it "
            f"creates CUDA streams): use allgather on CPU {cuda}",
        )


def _batch(lay: Layout) -> Iterator[Problem]:
    t, p = lay.training, lay.parallelism
    unit = t.micro_batch_size * p.data
    if unit < 1:
        pass  # no data-parallel size: the layout rule reports why
    elif t.global_batch_size % unit:
        lower = max(unit, t.global_batch_size // unit * unit)
        yield Problem(
            "training.globalBatchSize",
            f"globalBatchSize ({t.global_batch_size}) must be a multiple of microBatchSize × "
            f"data ({t.micro_batch_size} × {p.data} = {unit}): use e.g. {lower} or {lower + unit}",
        )
    elif t.num_microbatches != t.global_batch_size // unit:
        yield Problem(
            "training.globalBatchSize",
            f"numMicrobatches ({t.num_microbatches}) must be globalBatchSize / (microBatchSize × "
            f"data) = {t.global_batch_size // unit}",
        )
    elif p.interleaved and p.pipeline > 1 and t.num_microbatches % p.pipeline:
        yield Problem(
            "training.globalBatchSize",
            f"the interleaved schedule needs the number of microbatches ({t.num_microbatches}) to "
            f"be a multiple of pipeline ({p.pipeline}): scale globalBatchSize accordingly",
        )
    if t.min_lr > t.lr:
        yield Problem("training.minLr", f"minLr ({t.min_lr}) exceeds lr ({t.lr})")
    if t.warmup_iters >= t.train_iters:
        # Megatron-Core's scheduler asserts warmup < decay steps (decay runs to trainIters).
        yield Problem(
            "training.warmupIters",
            f"warmupIters ({t.warmup_iters}) must be below trainIters ({t.train_iters})",
        )


def _data(lay: Layout) -> Iterator[Problem]:
    d = lay.data
    if d.mock == (d.blend is not None):
        yield Problem("data", "set exactly one of data.mock: true or data.blend")
    if d.blend is not None and d.tokenizer is None:
        yield Problem("data.tokenizer", "data.blend needs data.tokenizer.path")


def _profiling(lay: Layout) -> Iterator[Problem]:
    prof = lay.profiling
    if prof is None:
        return
    world = lay.resources.nodes * lay.resources.procs_per_node
    if prof.start_step > prof.end_step:
        yield Problem("profiling.endStep", "endStep must not be before startStep")
    if prof.start_step > lay.training.train_iters:
        yield Problem(
            "profiling.startStep",
            f"startStep ({prof.start_step}) is after training.trainIters "
            f"({lay.training.train_iters})",
        )
    bad = [r for r in prof.ranks if r >= world]
    if bad:
        yield Problem("profiling.ranks", f"ranks {bad} do not exist (world size {world})")


RULES = (
    _layout,
    _tensor,
    _pipeline,
    _fsdp,
    _experts,
    _sequence,
    _platform,
    _batch,
    _data,
    _profiling,
)


def check(layout: Layout) -> list[Problem]:
    """Every layout problem (empty when the layout can run)."""
    return [problem for rule in RULES for problem in rule(layout)]


def check_config(cfg: TrainerConfig) -> list[Problem]:
    return check(
        Layout(cfg.model, cfg.parallelism, cfg.training, cfg.data, cfg.resources, cfg.profiling)
    )
