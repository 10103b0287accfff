"""Layout search (pure): every valid parallel layout of a spec that fits, ranked by a cost model.

`mjob plan --suggest` prints the ranking; `parallelism.auto` runs the first. A candidate is the
spec with its degrees (tensor, pipeline, virtualPipeline, context, expert, expertTensor, fsdp)
filled in; the planner validates it exactly as a hand-written layout (the contract's rules and the
memory budget), so a suggestion never breaks a rule. Recompute is not searched: each candidate
takes the lightest recomputation (from the spec's training.recompute up) that fits the budget,
which is always the cheapest one for that layout.

The cost model estimates one optimizer step's time on one GPU, as a multiple of the ideal (all
FLOPs at full efficiency, nothing exposed), from the model's shapes and these assumptions about an
H100-class node (`Hardware`): NVLink inside a node, InfiniBand between nodes, and the share of each
collective that Megatron-Core overlaps with compute. Each term is kept with the reason it costs,
so the ranking explains itself:
  - compute: GEMM efficiency falls as tensor parallelism shrinks the matrices;
  - recompute: full recomputation repeats the forward pass (+1/3 of a step), selective only
    the attention core;
  - tensor: the all-gathers/reduce-scatters (all-reduces without SP) of each layer's
    activations, exposed, over NVLink (TP never leaves a node);
  - context: ring attention's key/value exchange, mostly hidden behind attention;
  - expert: the token all-to-all of each MoE layer, exposed; over InfiniBand once
    expertTensor × expert spans more than a node;
  - pipeline: the 1F1B bubble (pipeline - 1) / (virtualPipeline × microbatches), plus the
    stage-boundary sends;
  - data: the gradient reduce-scatter and parameter all-gather (FSDP: gathers in both passes),
    mostly overlapped with the backward pass.
It ranks layouts; it does not predict a step time, and no GPU measurement went into it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from megatron_contract.choices import CPU, RECOMPUTE
from megatron_contract.config import ModelConfig, TrainingConfig
from megatron_contract.rules import divisors
from megatron_operator.api.errors import SpecError
from megatron_operator.api.spec import MegatronJobSpec, ParallelismSpec
from megatron_operator.core.memory import MemoryEstimate, ParallelDegrees

P = TypeVar("P")  # the planner's Plan (passed in, so this module does not import the planner)


@dataclass(frozen=True)
class Hardware:
    """What the cost model assumes about a GPU node (H100 SXM, 8 per node, NDR InfiniBand)."""

    peak_flops: float = 989e12  # dense bf16
    gemm_efficiency: float = 0.55  # of peak, for large GEMMs
    nvlink_bytes_per_s: float = 360e9  # bus bandwidth of a collective inside a node
    network_bytes_per_s: float = 45e9  # per GPU between nodes (400 Gb/s)


H100 = Hardware()
# Shares of each communication left exposed after Megatron-Core's overlap.
EXPOSED = {
    "tensor": 1.0,
    "context": 0.3,
    "expert": 1.0,
    "pipeline": 0.5,
    "data": 0.2,
    "fsdp": 0.4,  # gathers in the forward and the backward: less of it hides than DP's
}
RECOMPUTE_COST = {"none": 0.0, "selective": 0.05, "full": 1.0 / 3.0}
TIGHT_MEMORY = 0.92  # above this share of gpuMemoryGiB a layout is marked (and costs) "tight"
MAX_VIRTUAL = 8  # virtual stages tried per pipeline stage (Megatron recipes use 2 to 8)
MEMORY_FIELD = "spec.resources.gpuMemoryGiB"  # the planner's memory-budget error


@dataclass(frozen=True)
class Term:
    name: str
    share: float  # of the ideal step time
    why: str


@dataclass(frozen=True)
class Cost:
    relative_step_time: float  # 1.0: every FLOP at peak, no exposed communication
    terms: tuple[Term, ...]

    def why(self) -> str:
        shown = [t for t in self.terms if t.share >= 0.005 or t.name == "compute"]
        return "; ".join(f"{t.name} {t.share:.0%} ({t.why})" for t in shown)


@dataclass(frozen=True)
class Suggestion(Generic[P]):
    parallelism: ParallelismSpec
    recompute: str
    plan: P
    cost: Cost
    tight: bool  # memory above TIGHT_MEMORY of the budget

    def to_dict(self, layout: str, memory: MemoryEstimate) -> dict[str, Any]:
        p = self.parallelism
        return {
            "layout": layout,
            "parallelism": {
                "tensor": p.tensor,
                "pipeline": p.pipeline,
                "virtualPipeline": p.virtual_pipeline,
                "context": p.context,
                "expert": p.expert,
                "expertTensor": p.expert_tensor,
                "fsdp": p.fsdp,
            },
            "recompute": self.recompute,
            "relativeStepTime": round(self.cost.relative_step_time, 4),
            "perGpuGiB": round(memory.per_gpu_gib, 2),
            "tight": self.tight,
            "why": self.cost.why(),
            "terms": {t.name: round(t.share, 4) for t in self.cost.terms},
        }


def _options(spec: MegatronJobSpec, model: ModelConfig) -> Iterator[ParallelismSpec]:
    """Every combination of degrees worth planning (the rules then drop the invalid ones)."""
    r = spec.resources
    world = r.nodes * r.procs_per_node
    gpu = r.accelerator != CPU
    layers, moe = model.num_layers, model.moe
    sp = spec.parallelism.sequence_parallel
    for tp in divisors(r.procs_per_node):
        for pp in divisors(layers):
            if world % (tp * pp):
                continue
            per_stage = layers // pp
            vpps: list[int | None] = [None]
            if pp > 1:
                vpps += [v for v in divisors(per_stage, MAX_VIRTUAL) if v > 1]
            cps = [c for c in divisors(world // (tp * pp), 16) if gpu or c == 1]
            eps = [e for e in divisors(moe.num_experts, world // pp)] if moe and gpu else [1]
            for vpp in vpps:
                for cp in cps:
                    for ep in eps:
                        etps = sorted({1, tp}) if moe else [None]
                        for etp in etps:
                            for fsdp in (False, True) if gpu and pp == 1 else (False,):
                                fields: dict[str, Any] = {
                                    "tensor": tp,
                                    "pipeline": pp,
                                    "virtualPipeline": vpp,
                                    "context": cp,
                                    "expert": ep,
                                    "expertTensor": etp,
                                    "sequenceParallel": sp,
                                    "fsdp": fsdp,
                                }
                                yield ParallelismSpec.model_validate(
                                    {k: v for k, v in fields.items() if v is not None}
                                )


def suggest(
    spec: MegatronJobSpec,
    model: ModelConfig,
    plan: Callable[[MegatronJobSpec], P],
    view: Callable[[P], tuple[ModelConfig, ParallelDegrees, TrainingConfig, MemoryEstimate]],
    hardware: Hardware = H100,
) -> list[Suggestion[P]]:
    """Every valid layout of `spec` that fits, cheapest first (ties: fewer model-parallel ranks).

    `model` is the resolved model (for the search bounds), `plan` the planner for a manual layout
    and `view` what the cost model reads from a plan."""
    start = RECOMPUTE.index(spec.training.recompute)
    found: list[Suggestion[P]] = []
    for option in _options(spec, model):
        for recompute in RECOMPUTE[start:]:
            candidate = spec.model_copy(
                update={
                    "parallelism": option,
                    "training": spec.training.model_copy(update={"recompute": recompute}),
                }
            )
            try:
                planned = plan(candidate)
            except SpecError as err:
                if all(e.path == MEMORY_FIELD for e in err.errors):
                    continue  # does not fit: a heavier recompute may
                break  # breaks a rule, whatever the recompute
            m, d, t, mem = view(planned)
            budget = spec.resources.gpu_memory_gib
            tight = spec.resources.accelerator != CPU and mem.per_gpu_gib > TIGHT_MEMORY * budget
            cost = step_cost(m, d, t, spec.resources.procs_per_node, tight, hardware)
            found.append(Suggestion(option, recompute, planned, cost, tight))
            break  # the lightest recompute that fits is the cheapest for this layout
    found.sort(key=lambda s: (round(s.cost.relative_step_time, 6), _model_parallel(s.parallelism)))
    return found


def _model_parallel(p: ParallelismSpec) -> int:
    return p.tensor * p.pipeline * p.context * p.expert * (p.virtual_pipeline or 1)


# ---------------------------------------------------------------------------------------------
# The cost model


def _attention_params(m: ModelConfig) -> float:
    if m.mla is not None:
        a = m.mla
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q = m.hidden_size * m.num_attention_heads * qk
        kv = m.hidden_size * a.kv_lora_rank + a.kv_lora_rank * m.num_attention_heads * (
            a.qk_head_dim + a.v_head_dim
        )
        return float(q + kv + m.num_attention_heads * a.v_head_dim * m.hidden_size)
    q = m.kv_channels * m.num_attention_heads
    kv = m.kv_channels * m.num_query_groups
    return float(m.hidden_size * (q + 2 * kv) + q * m.hidden_size)


def _mlp_params(m: ModelConfig, ffn: int) -> float:
    return float(m.hidden_size * ffn * (3 if m.activation == "swiglu" else 2))


def step_cost(
    m: ModelConfig,
    d: ParallelDegrees,
    t: TrainingConfig,
    gpus_per_node: int,
    tight: bool = False,
    hw: Hardware = H100,
) -> Cost:
    """One step's time on one GPU relative to the ideal, as explained terms (module docstring)."""
    bf = 2.0  # bytes of a bf16 activation
    h, s = m.hidden_size, m.seq_length
    tokens = t.micro_batch_size * s / d.cp  # tokens per GPU per microbatch
    layers = m.num_layers // d.pp  # per stage
    micro = t.num_microbatches
    attn_dim = m.kv_channels * m.num_attention_heads

    # FLOPs per layer per microbatch on this GPU (forward + backward = 3 × forward).
    dense_mlp = _mlp_params(m, m.ffn_hidden_size)
    attention = 6 * tokens * (_attention_params(m) / d.tp) + 6 * tokens * 2 * s * attn_dim / d.tp
    if m.moe is not None:
        moe = m.moe
        moe_layers = m.num_layers - moe.first_k_dense_layers
        experts = 6 * tokens * moe.router_top_k * _mlp_params(m, moe.ffn_hidden_size) / d.etp
        shared = 6 * tokens * _mlp_params(m, moe.shared_expert_ffn_hidden_size or 0) / d.tp
        mlp = (
            moe_layers * (experts + shared)
            + moe.first_k_dense_layers * 6 * tokens * dense_mlp / d.tp
        ) / m.num_layers
    else:
        moe_layers = 0
        mlp = 6 * tokens * dense_mlp / d.tp
    layer_flops = attention + mlp
    ideal = layers * micro * layer_flops / hw.peak_flops / hw.gemm_efficiency
    # Smaller matrices per GPU run below the large-GEMM efficiency: ~4% per halving of the
    # weights by TP, and per halving of the tokens by CP below 4096 a GPU.
    efficiency = 1.0 + 0.04 * math.log2(d.tp) + 0.04 * math.log2(max(1.0, 4096 / tokens))
    terms: list[Term] = [
        Term(
            "compute",
            efficiency - 1.0,
            f"TP{d.tp}·CP{d.cp} shrink each GEMM {d.tp * d.cp}×"
            if d.tp * d.cp > 1
            else "whole GEMMs",
        )
    ]
    terms.append(
        Term(
            "recompute",
            RECOMPUTE_COST[t.recompute] * efficiency,
            {
                "none": "none needed",
                "selective": "attention core recomputed",
                "full": "the forward pass runs twice",
            }[t.recompute],
        )
    )

    def share(seconds: float) -> float:
        return seconds / ideal

    def bandwidth(group_span: int) -> tuple[float, str]:
        if group_span <= gpus_per_node:
            return hw.nvlink_bytes_per_s, "NVLink"
        return hw.network_bytes_per_s, "the network"

    activation = tokens * h * bf
    if d.tp > 1:
        # 4 collectives forward and 4 backward per layer, each moving (TP-1)/TP of the tensor.
        moved = 8 * (d.tp - 1) / d.tp * activation * layers * micro
        terms.append(
            Term(
                "tensor",
                EXPOSED["tensor"] * share(moved / hw.nvlink_bytes_per_s),
                f"TP{d.tp} activation collectives inside a node",
            )
        )
    if d.cp > 1:
        bw, link = bandwidth(d.tp * d.cp)
        kv = tokens * 2 * m.kv_channels * m.num_query_groups * bf
        moved = 3 * (d.cp - 1) * kv * layers * micro
        terms.append(
            Term("context", EXPOSED["context"] * share(moved / bw), f"CP{d.cp} ring over {link}")
        )
    if m.moe is not None and d.ep > 1:
        bw, link = bandwidth(d.etp * d.ep)
        stage_moe = moe_layers / d.pp
        moved = 4 * (d.ep - 1) / d.ep * activation * m.moe.router_top_k * stage_moe * micro
        terms.append(
            Term(
                "expert", EXPOSED["expert"] * share(moved / bw), f"EP{d.ep} all-to-all over {link}"
            )
        )
    if d.pp > 1:
        vpp = d.vpp or 1
        bubble = (d.pp - 1) / (vpp * micro)
        sends = 2 * vpp * micro * activation / hw.network_bytes_per_s
        busy = 1.0 + sum(x.share for x in terms)  # the bubble idles every other term too
        pipeline = bubble * busy + EXPOSED["pipeline"] * share(sends)
        why = f"bubble (PP{d.pp}-1)/(VPP{vpp}·{micro} microbatches) = {bubble:.1%}"
        terms.append(Term("pipeline", pipeline, why))
    # Weights on this GPU whose gradients are reduced over the data-parallel ranks: the dense
    # ones over DP × CP, the experts' over expert-data (EP shrinks both their share and group).
    dense = layers * (_attention_params(m) + (dense_mlp if m.moe is None else 0.0)) / d.tp
    expert = 0.0
    if m.moe is not None:
        expert = (moe_layers / d.pp * m.moe.num_experts * _mlp_params(m, m.moe.ffn_hidden_size)) / (
            d.ep * d.etp
        )
    passes, exposed = (3.0, EXPOSED["fsdp"]) if d.fsdp else (2.0, EXPOSED["data"])
    moved = 0.0
    ranks = d.dp * d.cp
    if ranks > 1:
        moved += passes * (ranks - 1) / ranks * dense * 4
    if d.edp > 1:
        moved += passes * (d.edp - 1) / d.edp * expert * 4
    if moved:
        bw, link = bandwidth(d.tp * ranks)
        why = "FSDP gathers weights in both passes" if d.fsdp else "gradient reduce-scatter + "
        why = why if d.fsdp else why + "parameter all-gather"
        terms.append(Term("data", exposed * share(moved / bw), f"{why} over {link} (DP{d.dp})"))
    if tight:
        terms.append(Term("memory", 0.02, "estimate above 92% of gpuMemoryGiB"))
    total = 1.0 + sum(x.share for x in terms)
    return Cost(total, tuple(terms))
