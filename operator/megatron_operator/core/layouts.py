"""Layout search (pure): every valid parallel layout of a spec that fits, ranked by a cost model.

`mjob plan --suggest` prints the ranking; `parallelism.auto` runs the first. A candidate is the
spec with its degrees (tensor, pipeline, virtualPipeline, context, expert, expertTensor, fsdp)
filled in; the planner validates it exactly as a hand-written layout (the contract's rules and the
memory budget), so a suggestion never breaks a rule. Recompute is not searched: each candidate
takes the lightest recomputation (from the spec's training.recompute up) that fits the budget,
which is always the cheapest one for that layout.

The cost model (core/cost.py) ranks them: one step's time on one GPU relative to the ideal, as
explained terms (compute, recompute, tensor, context, expert, pipeline, data, memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from megatron_contract.choices import CPU, RECOMPUTE
from megatron_contract.config import ModelConfig, TrainingConfig
from megatron_contract.rules import divisors
from megatron_operator.api.errors import SpecError
from megatron_operator.api.spec import MegatronJobSpec, ParallelismSpec
from megatron_operator.core.cost import H100, TIGHT_MEMORY, Cost, Hardware, step_cost
from megatron_operator.core.memory import MemoryEstimate, ParallelDegrees

P = TypeVar("P")  # the planner's Plan (passed in, so this module does not import the planner)


MAX_VIRTUAL = 8  # virtual stages tried per pipeline stage (Megatron recipes use 2 to 8)
MEMORY_FIELD = "spec.resources.gpuMemoryGiB"  # the planner's memory-budget error


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
