"""The layout planner (pure): spec → validated plan of degrees, rank coordinates and memory.

Every rule of Megatron-Core's layout validity is checked here, all at once, before any GPU is
allocated. `api/cel.py` holds the same rules as CEL so the apiserver rejects bad specs on apply;
the table tests run both against the same cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from .api.errors import FieldError, SpecError
from .api.spec import RESERVED_ENV, MegatronJobSpec
from .memory import MemoryEstimate, ParallelDegrees, estimate
from .resolve import ResolvedModel, padded_vocab_size, resolve_model

Dim = Literal["tp", "cp", "dp", "pp", "etp", "ep", "edp"]


class RankCoord(NamedTuple):
    rank: int
    node: int
    local_rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int
    etp: int
    edp: int


@dataclass(frozen=True)
class Plan:
    """A validated layout. Rank order is Megatron-Core's default `tp-cp-ep-dp-pp`."""

    model: ResolvedModel
    degrees: ParallelDegrees
    world_size: int
    nodes: int
    procs_per_node: int
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int
    padded_vocab_size: int
    precision: str
    accelerator: str
    memory: MemoryEstimate

    @property
    def gpus(self) -> int:
        return self.world_size if self.accelerator != "none" else 0

    def layout_string(self) -> str:
        """Short form for printing, e.g. TP8·PP2·DP4 (degrees of 1 omitted, except DP)."""
        d = self.degrees
        parts = [("TP", d.tp), ("PP", d.pp), ("VPP", d.vpp or 1), ("CP", d.cp), ("EP", d.ep)]
        if d.etp != d.tp and d.ep > 1:
            parts.append(("ETP", d.etp))
        out = [f"{k}{v}" for k, v in parts if v > 1]
        return "·".join([*out, f"DP{d.dp}"])

    def _strides(self, dim: Dim) -> tuple[int, int]:
        d = self.degrees
        dense = {"tp": (1, d.tp), "cp": (d.tp, d.cp), "dp": (d.tp * d.cp, d.dp)}
        expert = {"etp": (1, d.etp), "ep": (d.etp, d.ep), "edp": (d.etp * d.ep, d.edp)}
        if dim == "pp":
            return self.world_size // d.pp, d.pp
        return {**dense, **expert}[dim]

    def coord(self, rank: int) -> RankCoord:
        d = self.degrees
        node, local = divmod(rank, self.procs_per_node)
        tp, rest = rank % d.tp, rank // d.tp
        cp, rest = rest % d.cp, rest // d.cp
        dp, pp = rest % d.dp, rest // d.dp
        etp, rest = rank % d.etp, rank // d.etp
        ep, edp = rest % d.ep, (rest // d.ep) % d.edp
        return RankCoord(rank, node, local, tp, cp, dp, pp, ep, etp, edp)

    def ranks(self) -> list[RankCoord]:
        """Coordinates of every rank, in rank order."""
        return [self.coord(r) for r in range(self.world_size)]

    def rank_of(self, tp: int, cp: int, dp: int, pp: int) -> int:
        d = self.degrees
        return tp + d.tp * (cp + d.cp * (dp + d.dp * pp))

    def expert_rank_of(self, etp: int, ep: int, edp: int, pp: int) -> int:
        d = self.degrees
        return etp + d.etp * (ep + d.ep * (edp + d.edp * pp))

    def group(self, rank: int, dim: Dim) -> list[int]:
        """Ranks that share every coordinate with `rank` except `dim` (its process group)."""
        stride, size = self._strides(dim)
        base = rank - ((rank // stride) % size) * stride
        return [base + i * stride for i in range(size)]

    def to_dict(self, include_ranks: bool = True) -> dict[str, Any]:
        d = self.degrees
        mem = self.memory
        out: dict[str, Any] = {
            "layout": self.layout_string(),
            "worldSize": self.world_size,
            "nodes": self.nodes,
            "procsPerNode": self.procs_per_node,
            "gpus": self.gpus,
            **d.to_api(),
            "globalBatchSize": self.global_batch_size,
            "microBatchSize": self.micro_batch_size,
            "numMicrobatches": self.num_microbatches,
            "paddedVocabSize": self.padded_vocab_size,
            "precision": self.precision,
            "memory": {
                "perGpuGiB": round(mem.per_gpu_gib, 3),
                "weightsAndOptimizerGiB": round(mem.weights_and_optimizer_gib, 3),
                "activationsGiB": round(mem.activations_gib, 3),
                "overheadGiB": mem.overhead_gib,
                "parametersTotal": mem.parameters_total,
                "parametersPerGpu": mem.parameters_per_gpu,
            },
        }
        if include_ranks:
            out["ranks"] = [
                {
                    "rank": c.rank,
                    "node": c.node,
                    "localRank": c.local_rank,
                    "tp": c.tp,
                    "cp": c.cp,
                    "dp": c.dp,
                    "pp": c.pp,
                    "ep": c.ep,
                    "etp": c.etp,
                    "edp": c.edp,
                }
                for c in self.ranks()
            ]
        return out


STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def valid_resource_name(name: str) -> bool:
    """What the apiserver accepts in a container's requests and limits."""
    return name in STANDARD_RESOURCES or name.startswith("hugepages-") or "/" in name


def _divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def _choices(values: list[int]) -> str:
    shown = [str(v) for v in values]
    if len(shown) > 12:
        shown = [*shown[:11], "…", shown[-1]]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + f" or {shown[-1]}"


@dataclass(frozen=True)
class _Ctx:
    spec: MegatronJobSpec
    model: ResolvedModel
    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    dp: int | None  # None when tensor × pipeline × context does not divide the world


def _e(path: str, message: str) -> FieldError:
    return FieldError(f"spec.{path}", message)


def _rules_layout(c: _Ctx) -> Iterator[FieldError]:
    s, ppn = c.spec, c.spec.resources.procs_per_node
    if ppn % c.tp:
        yield _e(
            "parallelism.tensor",
            f"tensor ({c.tp}) must divide resources.procsPerNode ({ppn}) so that each tensor-"
            f"parallel group stays inside one node: use {_choices(_divisors(ppn))}",
        )
    model_parallel = c.tp * c.pp * c.cp
    if c.dp is None:
        yield _e(
            "parallelism",
            f"tensor × pipeline × context ({model_parallel}) must divide resources.nodes × "
            f"resources.procsPerNode ({c.world}): change the degrees or the number of nodes",
        )
    elif s.parallelism.data not in ("auto", c.dp):
        yield _e(
            "parallelism.data",
            f"data ({s.parallelism.data}) × tensor × pipeline × context ({model_parallel}) = "
            f"{int(s.parallelism.data) * model_parallel} GPUs, but resources.nodes × "
            f"resources.procsPerNode = {c.world}: set data to {c.dp} or 'auto'",
        )


def _rules_tensor(c: _Ctx) -> Iterator[FieldError]:
    m, tp = c.model, c.tp
    if m.num_attention_heads % tp:
        yield _e(
            "parallelism.tensor",
            f"numAttentionHeads ({m.num_attention_heads}) is not divisible by parallelism.tensor "
            f"({tp}): use {_choices(_divisors(m.num_attention_heads))}",
        )
    g = m.num_query_groups
    if m.num_attention_heads % g:
        yield _e(
            "model.numQueryGroups",
            f"numAttentionHeads ({m.num_attention_heads}) must be a multiple of numQueryGroups "
            f"({g}): use {_choices(_divisors(m.num_attention_heads))}",
        )
    elif g % tp and tp % g:
        yield _e(
            "parallelism.tensor",
            f"numQueryGroups ({g}) and parallelism.tensor ({tp}) must divide one another: use "
            f"a tensor size among {_choices(sorted(set(_divisors(g)) | {g * k for k in (2, 4, 8)}))}",
        )
    if m.ffn_hidden_size % tp:
        yield _e(
            "parallelism.tensor",
            f"ffnHiddenSize ({m.ffn_hidden_size}) is not divisible by parallelism.tensor ({tp}): "
            f"use {_choices([d for d in _divisors(m.ffn_hidden_size) if d <= 64])}",
        )
    sp = c.spec.parallelism.sequence_parallel
    if sp and tp == 1:
        yield _e(
            "parallelism.sequenceParallel",
            "sequenceParallel needs parallelism.tensor > 1: set tensor ≥ 2 or turn it off",
        )
    if m.moe is not None and tp > 1 and not sp:
        yield _e(
            "parallelism.sequenceParallel",
            f"MoE models with tensor parallelism ({tp}) need sequenceParallel: true",
        )


def _rules_pipeline(c: _Ctx) -> Iterator[FieldError]:
    m, pp = c.model, c.pp
    vpp = c.spec.parallelism.virtual_pipeline
    if m.num_layers % pp:
        yield _e(
            "parallelism.pipeline",
            f"numLayers ({m.num_layers}) is not divisible by parallelism.pipeline ({pp}): use "
            f"{_choices(_divisors(m.num_layers))}",
        )
    if vpp is not None:
        if pp == 1:
            yield _e(
                "parallelism.virtualPipeline",
                "virtualPipeline needs parallelism.pipeline > 1: remove it or raise pipeline",
            )
        elif m.num_layers % (pp * vpp):
            per_rank = m.num_layers // pp if m.num_layers % pp == 0 else None
            hint = f"use {_choices(_divisors(per_rank))}" if per_rank else "fix pipeline first"
            yield _e(
                "parallelism.virtualPipeline",
                f"numLayers ({m.num_layers}) must split into pipeline × virtualPipeline "
                f"({pp} × {vpp}) equal stages: {hint}",
            )


def _rules_experts(c: _Ctx) -> Iterator[FieldError]:
    m, ep, etp = c.model, c.ep, c.etp
    if ep > 1 and m.moe is None:
        yield _e("parallelism.expert", f"expert ({ep}) > 1 needs an MoE model (model.moe)")
    if m.moe is not None:
        n = m.moe.num_experts
        if n % ep:
            yield _e(
                "parallelism.expert",
                f"model.moe.numExperts ({n}) is not divisible by parallelism.expert ({ep}): use "
                f"{_choices(_divisors(n))}",
            )
        if m.moe.router_top_k > n:
            yield _e(
                "model.moe.routerTopK",
                f"routerTopK ({m.moe.router_top_k}) exceeds numExperts ({n})",
            )
        if m.moe.ffn_hidden_size % etp:
            yield _e(
                "parallelism.expertTensor",
                f"model.moe.ffnHiddenSize ({m.moe.ffn_hidden_size}) is not divisible by "
                f"expertTensor ({etp})",
            )
        if m.moe.first_k_dense_layers > m.num_layers:
            yield _e(
                "model.moe.firstKDenseLayers",
                f"firstKDenseLayers ({m.moe.first_k_dense_layers}) exceeds numLayers "
                f"({m.num_layers})",
            )
    if m.moe is None and ep == 1:
        return  # a dense model's expert groups mirror its tensor groups: nothing more to check
    # With tensor × pipeline × context dividing the world, this is the same as "expertTensor
    # × expert divides tensor × context × data", Megatron's other form of the rule.
    if c.world % (etp * ep * c.pp):
        yield _e(
            "parallelism.expert",
            f"expertTensor × expert × pipeline ({etp} × {ep} × {c.pp}) must divide the world "
            f"size ({c.world})",
        )


def _rules_sequence(c: _Ctx) -> Iterator[FieldError]:
    m, cp = c.model, c.cp
    if cp > 1 and m.seq_length % (2 * cp):
        yield _e(
            "parallelism.context",
            f"model.seqLength ({m.seq_length}) must be divisible by 2 × context ({2 * cp}) for "
            "load-balanced context parallelism",
        )
    if m.hidden_size % m.num_attention_heads and not m.kv_channels_explicit:
        yield _e(
            "model.hiddenSize",
            f"hiddenSize ({m.hidden_size}) is not divisible by numAttentionHeads "
            f"({m.num_attention_heads}): set model.kvChannels or change one of them",
        )
    if m.max_position_embeddings < m.seq_length:
        yield _e(
            "model.maxPositionEmbeddings",
            f"maxPositionEmbeddings ({m.max_position_embeddings}) is below seqLength "
            f"({m.seq_length}): raise it or shorten the sequence",
        )


def _rules_platform(c: _Ctx) -> Iterator[FieldError]:
    s = c.spec
    if s.resources.accelerator != "none":
        return
    if c.cp > 1:
        yield _e(
            "parallelism.context",
            "context parallelism is CUDA-only (it needs Transformer Engine attention): set "
            "context: 1 or resources.accelerator: nvidia.com/gpu",
        )
    if c.ep > 1:
        yield _e(
            "parallelism.expert",
            "expert parallelism is CUDA-only in this trainer: set expert: 1 or "
            "resources.accelerator: nvidia.com/gpu",
        )
    if s.training.precision not in (None, "fp32"):
        yield _e(
            "training.precision",
            f"{s.training.precision} needs a GPU; with resources.accelerator: none use fp32",
        )


def _rules_batch(c: _Ctx) -> Iterator[FieldError]:
    t = c.spec.training
    if c.dp is not None and t.global_batch_size % (t.micro_batch_size * c.dp):
        unit = t.micro_batch_size * c.dp
        lower = max(unit, t.global_batch_size // unit * unit)
        yield _e(
            "training.globalBatchSize",
            f"globalBatchSize ({t.global_batch_size}) must be a multiple of microBatchSize × "
            f"data ({t.micro_batch_size} × {c.dp} = {unit}): use e.g. {lower} or {lower + unit}",
        )
    elif c.dp is not None and c.spec.parallelism.virtual_pipeline and c.pp > 1:
        nmb = t.global_batch_size // (t.micro_batch_size * c.dp)
        if nmb % c.pp:
            yield _e(
                "training.globalBatchSize",
                f"the interleaved schedule needs the number of microbatches ({nmb}) to be a "
                f"multiple of pipeline ({c.pp}): scale globalBatchSize accordingly",
            )
    if t.min_lr > t.lr:
        yield _e("training.minLr", f"minLr ({t.min_lr}) exceeds lr ({t.lr})")
    if t.warmup_iters > t.train_iters:
        yield _e(
            "training.warmupIters",
            f"warmupIters ({t.warmup_iters}) exceeds trainIters ({t.train_iters})",
        )
    prof = c.spec.profiling
    if prof is not None:
        if prof.start_step > prof.end_step:
            yield _e("profiling.endStep", "endStep must not be before startStep")
        bad = [r for r in prof.ranks if r >= c.world]
        if bad:
            yield _e("profiling.ranks", f"ranks {bad} do not exist (world size {c.world})")


def _rules_objects(c: _Ctx) -> Iterator[FieldError]:
    s = c.spec
    if s.data.mock == (s.data.blend is not None):
        yield _e("data", "set exactly one of data.mock: true or data.blend")
    if s.data.blend is not None and s.data.tokenizer is None:
        yield _e("data.tokenizer", "data.blend needs data.tokenizer.path")
    if s.topology.mode != "none" and not s.topology.key:
        yield _e(
            "topology.key",
            f"topology.mode {s.topology.mode} needs a node label key, e.g. a rack label",
        )
    vol = s.checkpoint.volume
    if (vol.claim_name is None) == (vol.create is None):
        yield _e("checkpoint.volume", "set exactly one of volume.claimName or volume.create")
    if (
        vol.create is not None
        and s.resources.nodes > 1
        and ("ReadWriteMany" not in vol.create.access_modes)
    ):
        yield _e(
            "checkpoint.volume.create.accessModes",
            f"{s.resources.nodes} nodes write checkpoints to one volume: include ReadWriteMany",
        )
    for i, rule in enumerate(s.restart_policy.rules):
        if rule.exit_codes is None and rule.reasons is None:
            yield _e(f"restartPolicy.rules[{i}]", "a rule needs exitCodes, reasons or both")
    rp = s.restart_policy
    if rp.max_backoff_seconds < rp.backoff_seconds:
        yield _e(
            "restartPolicy.maxBackoffSeconds",
            f"maxBackoffSeconds ({rp.max_backoff_seconds}) is below backoffSeconds "
            f"({rp.backoff_seconds})",
        )
    for i, env in enumerate(s.env):
        if env.name in RESERVED_ENV:
            yield _e(f"env[{i}].name", f"{env.name} is set by the operator; remove it")
    for kind in ("requests", "limits"):
        bad = [k for k in getattr(s.resources, kind) if not valid_resource_name(k)]
        if bad:
            yield _e(
                f"resources.{kind}",
                f"{', '.join(repr(k) for k in bad)}: not a Kubernetes resource name; use cpu, "
                "memory, ephemeral-storage, hugepages-<size>, or a qualified name like rdma/ib",
            )
    gpu = s.resources.accelerator
    for kind in ("requests", "limits"):
        if gpu != "none" and gpu in getattr(s.resources, kind):
            yield _e(
                f"resources.{kind}",
                f"{gpu} is set from procsPerNode; remove it from resources.{kind}",
            )


_RULES = (
    _rules_layout,
    _rules_tensor,
    _rules_pipeline,
    _rules_experts,
    _rules_sequence,
    _rules_platform,
    _rules_batch,
    _rules_objects,
)


def _context(spec: MegatronJobSpec, model: ResolvedModel) -> _Ctx:
    p, r = spec.parallelism, spec.resources
    world = r.nodes * r.procs_per_node
    model_parallel = p.tensor * p.pipeline * p.context
    dp = world // model_parallel if world % model_parallel == 0 else None
    etp = p.expert_tensor if p.expert_tensor is not None else p.tensor
    return _Ctx(spec, model, world, p.tensor, p.pipeline, p.context, p.expert, etp, dp)


def validate(spec: MegatronJobSpec) -> list[FieldError]:
    """Every layout problem of the spec (empty when valid), memory budget included."""
    try:
        plan(spec)
    except SpecError as exc:
        return exc.errors
    return []


def plan(spec: MegatronJobSpec) -> Plan:
    """Validate the spec and plan its layout. Raises SpecError with every problem found."""
    model, errors = resolve_model(spec.model)
    if model is None:
        raise SpecError(errors)
    ctx = _context(spec, model)
    for rule in _RULES:
        errors.extend(rule(ctx))
    if errors or ctx.dp is None:
        raise SpecError(errors)

    t, r = spec.training, spec.resources
    on_gpu = r.accelerator != "none"
    precision = t.precision or ("bf16" if on_gpu else "fp32")
    world = ctx.world
    edp = world // (ctx.etp * ctx.ep * ctx.pp)
    degrees = ParallelDegrees(
        tp=ctx.tp,
        pp=ctx.pp,
        vpp=spec.parallelism.virtual_pipeline,
        cp=ctx.cp,
        ep=ctx.ep,
        etp=ctx.etp,
        dp=ctx.dp,
        edp=edp,
        sequence_parallel=spec.parallelism.sequence_parallel,
    )
    nmb = t.global_batch_size // (t.micro_batch_size * ctx.dp)
    padded = padded_vocab_size(model.vocab_size, ctx.tp)
    mem = estimate(
        model,
        degrees,
        padded,
        t.micro_batch_size,
        nmb,
        precision,
        t.recompute,
        distributed_optimizer=on_gpu,
        on_gpu=on_gpu,
    )
    if on_gpu and mem.per_gpu_gib > r.gpu_memory_gib:
        raise SpecError([_memory_error(mem, r.gpu_memory_gib, spec)])
    return Plan(
        model=model,
        degrees=degrees,
        world_size=world,
        nodes=r.nodes,
        procs_per_node=r.procs_per_node,
        global_batch_size=t.global_batch_size,
        micro_batch_size=t.micro_batch_size,
        num_microbatches=nmb,
        padded_vocab_size=padded,
        precision=precision,
        accelerator=r.accelerator,
        memory=mem,
    )


def _memory_error(mem: MemoryEstimate, budget: float, spec: MegatronJobSpec) -> FieldError:
    hints = ["raise parallelism.tensor or parallelism.pipeline"]
    if spec.training.recompute != "full":
        hints.append("set training.recompute: full")
    if spec.training.micro_batch_size > 1:
        hints.append("lower training.microBatchSize")
    if not spec.parallelism.sequence_parallel and spec.parallelism.tensor > 1:
        hints.append("turn on parallelism.sequenceParallel")
    return FieldError(
        "spec.resources.gpuMemoryGiB",
        f"the plan needs about {mem.per_gpu_gib:.1f} GiB per GPU (weights and optimizer "
        f"{mem.weights_and_optimizer_gib:.1f}, activations {mem.activations_gib:.1f}, overhead "
        f"{mem.overhead_gib:.1f}) but gpuMemoryGiB is {budget:g}: " + ", or ".join(hints),
    )
