"""Layout search (pure): every valid parallel layout of a spec that fits, ranked by a cost model.

`mjob plan --suggest` prints the ranking; `parallelism.auto` runs the first. A candidate is the
spec with its degrees (tensor, pipeline, virtualPipeline, context, expert, expertTensor, fsdp)
filled in; the planner validates it exactly as a hand-written layout (the contract's rules and the
memory budget), so a suggestion never breaks a rule. Recompute is not searched: each candidate
takes the lightest recomputation (from the spec's training.recompute up) that fits the budget,
which is always the cheapest one for that layout.

The cost model (core/cost.py) ranks them: one step's time on one GPU relative to the ideal, as
explained terms (compute, recompute, tensor, context, expert, pipeline, data, memory).

`auto` never runs a code path this project has not run: each layout family (the parallelism a
candidate uses) is verified only when a test of the project trains it (`VERIFIED` names the
test), and `auto` runs the best candidate whose families are all verified. `--suggest` still
ranks every candidate and marks the unverified ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Generic, TypeVar

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


class Family(StrEnum):
    """A kind of parallelism a layout uses (the spec's field names)."""

    DATA = "data"  # more than one data-parallel replica
    TENSOR = "tensor"
    PIPELINE = "pipeline"
    VIRTUAL_PIPELINE = "virtualPipeline"  # the interleaved schedule
    CONTEXT = "context"
    EXPERT = "expert"
    EXPERT_TENSOR = "expertTensor"  # MoE with tensor parallelism (experts TP-sharded or not)
    FSDP = "fsdp"  # Megatron FSDP


# The families `auto` may run, each with the test of this project that trains it (in CI, on
# CPU; a GPU test counts once it has run on a lent GPU and docs/benchmarks.md records it).
# tests/unit/test_layouts.py checks that each named test exists.
VERIFIED: Final[Mapping[Family, str]] = {
    Family.DATA: "tests/trainer/test_layouts.py::test_layout_matches_tp1[dp2]",
    Family.TENSOR: "tests/trainer/test_layouts.py::test_layout_matches_tp1[tp2]",
    Family.PIPELINE: "tests/trainer/test_layouts.py::test_layout_matches_tp1[pp2]",
    Family.VIRTUAL_PIPELINE: "tests/trainer/test_layouts.py::test_layout_matches_tp1[pp2-vpp2]",
    Family.EXPERT: "tests/trainer/test_cpu_platform.py::test_patches_are_sufficient_and_each_one_is_used",
}
# Why each other family is not verified (what `--suggest` says).
UNVERIFIED: Final[Mapping[Family, str]] = {
    Family.CONTEXT: "context parallelism needs Transformer Engine attention: no CPU test can "
    "train it and no GPU test has run it",
    Family.EXPERT_TENSOR: "MoE with tensor parallelism needs sequence parallelism, i.e. "
    "Transformer Engine: no CPU test can train it and no GPU test has run it",
    Family.FSDP: "Megatron FSDP is CUDA-only and has not run with data parallelism 2 or more on "
    "a GPU",
}


def families(p: ParallelismSpec, moe: bool) -> frozenset[Family]:
    """The families a layout uses (`moe`: the model has experts)."""
    found = {
        Family.TENSOR: p.tensor > 1,
        Family.PIPELINE: p.pipeline > 1,
        Family.VIRTUAL_PIPELINE: (p.virtual_pipeline or 1) > 1,
        Family.CONTEXT: p.context > 1,
        Family.EXPERT: p.expert > 1,
        Family.EXPERT_TENSOR: moe and (p.tensor > 1 or (p.expert_tensor or 1) > 1),
        Family.FSDP: p.fsdp,
    }
    return frozenset(f for f, used in found.items() if used)


def unverified(p: ParallelismSpec, moe: bool, data: int) -> tuple[Family, ...]:
    """The families of a layout (with `data` replicas) that no test of this project runs."""
    used = families(p, moe) | ({Family.DATA} if data > 1 else set())
    return tuple(sorted(f for f in used if f not in VERIFIED))


@dataclass(frozen=True)
class Suggestion(Generic[P]):
    parallelism: ParallelismSpec
    recompute: str
    plan: P
    cost: Cost
    tight: bool  # memory above TIGHT_MEMORY of the budget
    unverified: tuple[Family, ...]  # families no test of this project runs: auto skips it

    @property
    def verified(self) -> bool:
        return not self.unverified

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
            "verified": self.verified,
            "unverified": {f.value: UNVERIFIED[f] for f in self.unverified},
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
    and `view` what the cost model reads from a plan. A spec without training settings (a
    trainer.command's) has nothing to rank layouts by: none is suggested."""
    training = spec.training
    if training is None:
        return []
    start = RECOMPUTE.index(training.recompute)
    found: list[Suggestion[P]] = []
    for option in _options(spec, model):
        for recompute in RECOMPUTE[start:]:
            candidate = spec.model_copy(
                update={
                    "parallelism": option,
                    "training": training.model_copy(update={"recompute": recompute}),
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
            untested = unverified(option, model.moe is not None, d.dp)
            found.append(Suggestion(option, recompute, planned, cost, tight, untested))
            break  # the lightest recompute that fits is the cheapest for this layout
    found.sort(key=lambda s: (round(s.cost.relative_step_time, 6), _model_parallel(s.parallelism)))
    return found


def _model_parallel(p: ParallelismSpec) -> int:
    return p.tensor * p.pipeline * p.context * p.expert * (p.virtual_pipeline or 1)
