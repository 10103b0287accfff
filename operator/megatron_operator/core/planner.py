"""The layout planner (pure): spec → validated plan of degrees, rank coordinates and memory.

The spec is resolved into the contract's config sections and checked by the contract's layout rules
(`megatron_contract.rules`, the same code the trainer runs), plus the rules only a spec has (the
Kubernetes objects, the memory budget), all at once, before any GPU is allocated. Problems come
back naming the `spec.` field, with the valid values spelled out. `api/cel.py` holds the same rules
as CEL so the apiserver rejects bad specs on apply; the table tests run all three.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from megatron_contract.config import (
    BlendEntry,
    DataConfig,
    ModelConfig,
    ProfilingConfig,
    ResourcesConfig,
    TokenizerConfig,
    TrainingConfig,
    to_json,
)
from megatron_contract.env import OWNED as OWNED_ENV
from megatron_contract.paths import INIT_MOUNT
from megatron_contract.rules import Layout, Problem, check, default_sequence_parallel, divisors
from megatron_operator.api.errors import FieldError, SpecError
from megatron_operator.api.spec import FABRIC_RESOURCES, MegatronJobSpec, ParallelismSpec
from megatron_operator.core import layouts, tiers
from megatron_operator.core.command import problems as command_problems
from megatron_operator.core.layouts import Suggestion
from megatron_operator.core.memory import MemoryEstimate, ParallelDegrees, estimate
from megatron_operator.core.resolve import resolve_model

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
    """A validated layout. Rank order is Megatron-Core's default `tp-cp-ep-dp-pp`. With a
    trainer.command, model, training and data are None unless the spec gave them, and the
    memory is estimated only with a model and training settings."""

    model: ModelConfig | None
    degrees: ParallelDegrees
    training: TrainingConfig | None
    data: DataConfig | None
    resources: ResourcesConfig
    profiling: ProfilingConfig | None
    memory: MemoryEstimate | None

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.procs_per_node

    @property
    def nodes(self) -> int:
        return self.resources.nodes

    @property
    def procs_per_node(self) -> int:
        return self.resources.procs_per_node

    @property
    def accelerator(self) -> str:
        return self.resources.accelerator

    @property
    def gpus(self) -> int:
        return self.world_size if self.accelerator != "none" else 0

    def layout_string(self) -> str:
        """Short form for printing, e.g. TP8·PP2·DP4 (degrees of 1 omitted, except DP; FSDP4 for
        four data-parallel ranks sharding the model with Megatron FSDP)."""
        d = self.degrees
        parts = [("TP", d.tp), ("PP", d.pp), ("VPP", d.vpp or 1), ("CP", d.cp), ("EP", d.ep)]
        if d.etp != d.tp and d.ep > 1:
            parts.append(("ETP", d.etp))
        out = [f"{k}{v}" for k, v in parts if v > 1]
        return "·".join([*out, f"{'FSDP' if d.fsdp else 'DP'}{d.dp}"])

    def status_parallelism(self) -> dict[str, Any]:
        """status.parallelism: the degrees the job runs with (for parallelism.auto, the
        operator's choice) and the recompute they were planned with."""
        d = self.degrees
        out: dict[str, Any] = {
            "tensor": d.tp,
            "pipeline": d.pp,
            "context": d.cp,
            "expert": d.ep,
            "expertTensor": d.etp,
            "data": d.dp,
            "sequenceParallel": d.sequence_parallel,
            "fsdp": d.fsdp,
        }
        if self.training is not None:
            out["recompute"] = self.training.recompute
        if d.vpp:
            out["virtualPipeline"] = d.vpp
        return out

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
        d, t, mem = self.degrees, self.training, self.memory
        out: dict[str, Any] = {
            "layout": self.layout_string(),
            "worldSize": self.world_size,
            "nodes": self.nodes,
            "procsPerNode": self.procs_per_node,
            "gpus": self.gpus,
            **to_json(d.config()),
        }
        if t is not None:
            out.update(
                globalBatchSize=t.global_batch_size,
                microBatchSize=t.micro_batch_size,
                numMicrobatches=t.num_microbatches,
                precision=t.precision,
            )
        if self.model is not None:
            out["paddedVocabSize"] = self.model.padded_vocab_size
        if mem is not None:
            out["memory"] = {
                "perGpuGiB": round(mem.per_gpu_gib, 3),
                "weightsAndOptimizerGiB": round(mem.weights_and_optimizer_gib, 3),
                "activationsGiB": round(mem.activations_gib, 3),
                "overheadGiB": mem.overhead_gib,
                **(
                    {"constructionGiB": round(mem.construction_gib, 3)}
                    if mem.construction_gib
                    else {}
                ),
                "parametersTotal": mem.parameters_total,
                "parametersPerGpu": mem.parameters_per_gpu,
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


def _choices(values: list[int]) -> str:
    shown = [str(v) for v in values]
    if len(shown) > 12:
        shown = [*shown[:11], "…", shown[-1]]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + f" or {shown[-1]}"


def field_error(problem: Problem) -> FieldError:
    """A contract problem as the planner reports it: under `spec.`, with the valid values."""
    message = problem.message
    if problem.divisors_of is not None:
        message += f": use {_choices(divisors(problem.divisors_of, problem.divisors_below))}"
    return FieldError(f"spec.{problem.field}", message)


def _e(path: str, message: str) -> FieldError:
    return FieldError(f"spec.{path}", message)


def _spec_rules(spec: MegatronJobSpec, dp: int | None) -> Iterator[FieldError]:
    """Rules about the spec itself (the objects it asks for), which the trainer never sees."""
    s = spec
    world = s.resources.nodes * s.resources.procs_per_node
    if dp is not None and s.parallelism.data not in ("auto", dp):
        mp = world // dp
        yield _e(
            "parallelism.data",
            f"data ({s.parallelism.data}) × tensor × pipeline × context ({mp}) = "
            f"{int(s.parallelism.data) * mp} GPUs, but resources.nodes × resources.procsPerNode = "
            f"{world}: set data to {dp} or 'auto'",
        )
    if s.resources.spare_nodes and s.restart_policy.strategy != "InPlace":
        yield _e(
            "resources.spareNodes",
            f"{s.resources.spare_nodes} spare node(s) need restartPolicy.strategy InPlace: a "
            "lost node's rank moves onto a spare as an in-place restart; set the strategy to "
            "InPlace, or spareNodes to 0",
        )
    elif s.resources.spare_nodes and s.trainer is not None:
        yield _e(
            "resources.spareNodes",
            "spare nodes are for the built-in trainer: a trainer.command restarts in place, "
            "but its move onto a spare is not tested yet; set spareNodes to 0",
        )
    if s.topology.mode != "none" and not s.topology.key:
        yield _e(
            "topology.key",
            f"topology.mode {s.topology.mode} needs a node label key, e.g. a rack label",
        )
    c = s.checkpoint
    vol = c.volume
    if (vol is None) == (c.url is None):
        yield _e("checkpoint", "set exactly one of checkpoint.volume or checkpoint.url")
    if vol is not None and (vol.claim_name is None) == (vol.create is None):
        yield _e("checkpoint.volume", "set exactly one of volume.claimName or volume.create")
    if (
        vol is not None
        and vol.create is not None
        and s.resources.nodes + s.resources.spare_nodes > 1
        and ("ReadWriteMany" not in vol.create.access_modes)
    ):
        pods = s.resources.nodes + s.resources.spare_nodes
        spare = f" ({s.resources.spare_nodes} of them spares)" if s.resources.spare_nodes else ""
        yield _e(
            "checkpoint.volume.create.accessModes",
            f"{pods} nodes{spare} mount the checkpoint volume and write checkpoints to it: "
            "include ReadWriteMany",
        )
    if c.url is not None and c.msc is None:
        yield _e(
            "checkpoint.msc.configSecret",
            "checkpoint.url needs the MSC config: name the Secret holding it in "
            "checkpoint.msc.configSecret",
        )
    if c.url is None and c.msc is not None:
        yield _e("checkpoint.msc", "checkpoint.msc is only used with checkpoint.url: remove it")
    if c.url is not None and c.path is not None:
        yield _e(
            "checkpoint.path",
            "checkpoint.path is a directory inside the volume; with checkpoint.url put the "
            "directory in the URL instead",
        )
    p = s.parallelism
    if (
        p.fsdp
        and c.init is not None
        and c.init.megatron is not None
        and c.init.megatron.load == "full"
    ):
        yield _e(
            "checkpoint.init.megatron.load",
            "load: full reads a torch_dist checkpoint's optimizer state, which Megatron FSDP "
            "(fsdp_dtensor) cannot take: use load: weights, or fsdp: false",
        )
    if p.fsdp and c.url is not None:
        yield _e(
            "checkpoint.url",
            "Megatron FSDP saves fsdp_dtensor checkpoints with torch DCP's file-system writer, "
            "as Megatron-LM does: use checkpoint.volume, or fsdp: false",
        )
    if p.auto and c.sharding_type != "fully_reshardable":
        yield _e(
            "checkpoint.shardingType",
            "parallelism.auto may change tensor or pipeline when the job is resized: set "
            "checkpoint.shardingType: fully_reshardable so its checkpoints reshard to the new "
            "layout",
        )
    if p.auto and (
        p.tensor,
        p.pipeline,
        p.virtual_pipeline,
        p.context,
        p.expert,
        p.expert_tensor,
        p.data,
        p.fsdp,
    ) != (1, 1, None, 1, 1, None, "auto", False):
        yield _e(
            "parallelism.auto",
            "with auto the operator chooses the degrees: leave tensor, pipeline, "
            "virtualPipeline, context, expert, expertTensor, data and fsdp unset (mjob plan "
            "--suggest shows its choice), or remove auto",
        )
    for i, rule in enumerate(s.restart_policy.rules):
        if rule.exit_codes is None and rule.reasons is None:
            yield _e(f"restartPolicy.rules[{i}]", "a rule needs exitCodes, reasons or both")
    init = s.checkpoint.init
    if init is not None and (init.megatron is None) == (init.hugging_face is None):
        yield _e("checkpoint.init", "set exactly one of checkpoint.init.megatron or huggingFace")
    rp = s.restart_policy
    if rp.max_backoff_seconds < rp.backoff_seconds:
        yield _e(
            "restartPolicy.maxBackoffSeconds",
            f"maxBackoffSeconds ({rp.max_backoff_seconds}) is below backoffSeconds "
            f"({rp.backoff_seconds})",
        )
    for i, env in enumerate(s.env):
        if env.name in OWNED_ENV:
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
    yield from _network_rules(spec)
    yield from _init_rules(spec)


def network_resource(spec: MegatronJobSpec) -> str | None:
    """The device-plugin resource of the job's fabric, or None without one."""
    net = spec.resources.network
    if net.fabric == "none":
        return None
    return net.resource_name or FABRIC_RESOURCES[net.fabric]


def _network_rules(spec: MegatronJobSpec) -> Iterator[FieldError]:
    net, r = spec.resources.network, spec.resources
    if net.fabric == "none" and net.resource_name is not None:
        yield _e(
            "resources.network.resourceName",
            "needs a fabric: set resources.network.fabric (infiniband, roce or efa)",
        )
    name = network_resource(spec)
    for kind in ("requests", "limits"):
        if name is not None and name in getattr(r, kind):
            yield _e(
                f"resources.{kind}",
                f"{name} is set from resources.network.devices ({net.devices}); remove it from "
                f"resources.{kind}",
            )


def _init_rules(spec: MegatronJobSpec) -> Iterator[FieldError]:
    init = spec.checkpoint.init
    if init is None or init.volume is None:
        return
    source = init.megatron or init.hugging_face
    path = source.path if source is not None else INIT_MOUNT
    if not (path + "/").startswith(INIT_MOUNT + "/"):
        yield _e(
            "checkpoint.init",
            f"with checkpoint.init.volume the path to start from must be under {INIT_MOUNT}, "
            f"where that volume is mounted (got {path})",
        )


def _layout_of(
    spec: MegatronJobSpec, model: ModelConfig | None
) -> tuple[Layout, ParallelDegrees, int | None]:
    """The contract sections the rules check, and the degrees (dp is None when tensor × pipeline ×
    context does not divide the world)."""
    p, r = spec.parallelism, spec.resources
    world = r.nodes * r.procs_per_node
    mp = p.tensor * p.pipeline * p.context
    dp = world // mp if world % mp == 0 else None
    etp = p.expert_tensor if p.expert_tensor is not None else p.tensor
    expert_group = etp * p.expert * p.pipeline
    sequence_parallel = (
        p.sequence_parallel
        if p.sequence_parallel is not None
        else default_sequence_parallel(p.tensor, r.accelerator)
    )
    degrees = ParallelDegrees(
        tp=p.tensor,
        pp=p.pipeline,
        vpp=p.virtual_pipeline,
        cp=p.context,
        ep=p.expert,
        etp=etp,
        dp=dp or 0,
        edp=world // expert_group if world % expert_group == 0 else 0,
        sequence_parallel=sequence_parallel,
        fsdp=p.fsdp,
    )
    resources = ResourcesConfig(r.accelerator, r.nodes, r.procs_per_node)
    prof = spec.profiling
    profiling = (
        ProfilingConfig(prof.tool, prof.start_step, prof.end_step, tuple(prof.ranks))
        if prof
        else None
    )
    training = _training(spec, dp)
    layout = Layout(model, degrees.config(), training, _data(spec), resources, profiling)
    return layout, degrees, dp


def _training(spec: MegatronJobSpec, dp: int | None) -> TrainingConfig | None:
    t = spec.training
    if t is None:
        return None
    unit = t.micro_batch_size * (dp or 0)
    on_gpu = spec.resources.accelerator != "none"
    return TrainingConfig(
        global_batch_size=t.global_batch_size,
        micro_batch_size=t.micro_batch_size,
        num_microbatches=t.global_batch_size // unit if unit else 0,
        train_iters=t.train_iters,
        lr=t.lr,
        min_lr=t.min_lr,
        warmup_iters=t.warmup_iters,
        lr_decay_style=t.lr_decay_style,
        weight_decay=t.weight_decay,
        clip_grad=t.clip_grad,
        adam_beta1=t.adam_beta1,
        adam_beta2=t.adam_beta2,
        precision=t.precision or ("bf16" if on_gpu else "fp32"),
        seed=t.seed,
        recompute=t.recompute,
        log_interval=t.log_interval,
    )


def _data(spec: MegatronJobSpec) -> DataConfig | None:
    """The dataset section; None without one (a trainer.command job may give only a volume)."""
    d = spec.data
    if d is None or (spec.trainer is not None and not d.mock and not d.blend):
        return None
    return DataConfig(
        mock=d.mock,
        blend=tuple(BlendEntry(b.weight, b.prefix) for b in d.blend) if d.blend else None,
        tokenizer=TokenizerConfig(d.tokenizer.path) if d.tokenizer else None,
        split=d.split,
        num_workers=0,
    )


def validate(spec: MegatronJobSpec) -> list[FieldError]:
    """Every layout problem of the spec (empty when valid), memory budget included."""
    try:
        plan(spec)
    except SpecError as exc:
        return exc.errors
    return []


def plan(spec: MegatronJobSpec) -> Plan:
    """Validate the spec and plan its layout. Raises SpecError with every problem found.

    With parallelism.auto, the layout is the best tested one of `suggestions(spec)`
    (`auto_choice`): the same spec always gives the same choice, and a resize (another nodes or
    procsPerNode) plans again."""
    if spec.parallelism.auto:
        return _auto(spec)
    return _plan(spec)


def auto_view(p: Plan) -> tuple[ModelConfig, ParallelDegrees, TrainingConfig, MemoryEstimate]:
    """What the layout search reads from a plan (an automatic layout's always has all four)."""
    if p.model is None or p.training is None or p.memory is None:
        raise ValueError("an automatic layout is planned only with a model and training")
    return p.model, p.degrees, p.training, p.memory


def suggestions(spec: MegatronJobSpec) -> list[Suggestion[Plan]]:
    """Every valid layout of the spec that fits, best first (core/cost.py explains the cost
    model). The spec's own degrees are ignored; its sequenceParallel and recompute are kept
    (recompute may be raised to fit). Raises SpecError for problems no layout can fix."""
    if spec.model is None or spec.training is None:
        raise SpecError([_SUGGEST_NEEDS])
    manual = spec.model_copy(update={"parallelism": _AUTO_FREE})
    model, errors = resolve_model(spec.model, 1)
    if model is None:
        raise SpecError(errors)
    base_errors = [e for e in _spec_rules(manual, None) if not e.path.startswith(_LAYOUT_PATHS)]
    if base_errors:
        raise SpecError(base_errors)
    return _cached_suggestions(spec.model_copy(update={"parallelism": _with_sp(spec)}), model)


_AUTO_FREE = ParallelismSpec()
# The search ranks layouts by their memory and time estimates, which need both.
_AUTO_NEEDS = FieldError(
    "spec.parallelism.auto",
    "needs spec.model and spec.training to choose a layout: set them, or give the degrees "
    "(tensor, pipeline, ...) yourself",
)
_SUGGEST_NEEDS = FieldError(
    "spec.model",
    "layouts are ranked by the memory and time the model and its training settings need: set "
    "spec.model and spec.training to have them suggested",
)
_LAYOUT_PATHS = ("spec.parallelism",)


def _with_sp(spec: MegatronJobSpec) -> ParallelismSpec:
    sp = spec.parallelism.sequence_parallel
    return ParallelismSpec.model_validate({} if sp is None else {"sequenceParallel": sp})


def _cached_suggestions(spec: MegatronJobSpec, model: ModelConfig) -> list[Suggestion[Plan]]:
    key = json.dumps(spec.to_api(), sort_keys=True)
    found = _SUGGESTION_CACHE.get(key)
    if found is None:
        found = layouts.suggest(spec, model, _plan, auto_view)
        if len(_SUGGESTION_CACHE) >= _SUGGESTION_CACHE_SIZE:
            _SUGGESTION_CACHE.pop(next(iter(_SUGGESTION_CACHE)))
        _SUGGESTION_CACHE[key] = found
    return found


# The operator plans a job at every reconcile; an auto job's search is done once per spec.
_SUGGESTION_CACHE: dict[str, list[Suggestion[Plan]]] = {}
_SUGGESTION_CACHE_SIZE = 256


def _auto(spec: MegatronJobSpec) -> Plan:
    if spec.model is None or spec.training is None:
        raise SpecError([_AUTO_NEEDS])
    errors = list(_spec_rules(spec, None))
    if errors:
        raise SpecError(errors)
    found = suggestions(spec)
    chosen = auto_choice(found)
    if chosen is None:
        r = spec.resources
        fits = f"{r.nodes} × {r.procs_per_node} GPUs of {r.gpu_memory_gib:g} GiB"
        message = (
            f"no parallel layout of this model fits {fits} at this batch size: add nodes, "
            "lower training.microBatchSize, or raise resources.gpuMemoryGiB if the GPUs have more"
        )
        if found:
            kinds = sorted({f.value for s in found for f in s.unverified})
            message = (
                f"the only layouts that fit {fits} use {', '.join(kinds)}, which no test of "
                "this project has run, and auto runs only tested ones: set the degrees "
                "yourself (mjob plan --suggest lists them), add nodes, or lower "
                "training.microBatchSize"
            )
        raise SpecError([FieldError("spec.parallelism.auto", message)])
    return chosen.plan


def auto_choice(found: list[Suggestion[Plan]]) -> Suggestion[Plan] | None:
    """What parallelism.auto runs: the best suggestion whose layout families a test of this
    project trains (core/layouts.py, VERIFIED); None when no such layout fits."""
    return next((s for s in found if s.verified), None)


def _plan(spec: MegatronJobSpec) -> Plan:
    model: ModelConfig | None = None
    errors: list[FieldError] = []
    if spec.model is not None:
        model, errors = resolve_model(spec.model, spec.parallelism.tensor)
        if model is None:
            raise SpecError(errors)
    errors = list(errors)
    layout, degrees, dp = _layout_of(spec, model)
    errors.extend(field_error(p) for p in check(layout))
    errors.extend(_spec_rules(spec, dp))
    errors.extend(command_problems(spec))  # a trainer.command's $(VAR) that nothing sets
    if errors or dp is None:
        raise SpecError(errors)
    mem = _memory(spec, model, degrees, layout.training)
    budget = spec.resources.gpu_memory_gib
    if mem is not None and spec.resources.accelerator != "none" and mem.per_gpu_gib > budget:
        raise SpecError([_memory_error(mem, budget, spec)])
    precision = layout.training.precision if layout.training is not None else None
    host = tiers.host_memory_error(spec, tiers.pod_bytes(spec, mem, degrees, precision))
    if host is not None:
        raise SpecError([host])
    return Plan(
        model=model,
        degrees=degrees,
        training=layout.training,
        data=layout.data,
        resources=layout.resources,
        profiling=layout.profiling,
        memory=mem,
    )


def _memory(
    spec: MegatronJobSpec,
    model: ModelConfig | None,
    degrees: ParallelDegrees,
    t: TrainingConfig | None,
) -> MemoryEstimate | None:
    """The per-GPU estimate; None without a model and training settings to estimate from."""
    if model is None or t is None:
        return None
    on_gpu = spec.resources.accelerator != "none"
    return estimate(
        model,
        degrees,
        model.padded_vocab_size,
        t.micro_batch_size,
        t.num_microbatches,
        t.precision,
        t.recompute,
        distributed_optimizer=on_gpu,
        on_gpu=on_gpu,
    )


def _memory_error(mem: MemoryEstimate, budget: float, spec: MegatronJobSpec) -> FieldError:
    hints = ["raise parallelism.tensor or parallelism.pipeline"]
    t = spec.training
    if t is not None and t.recompute != "full":
        hints.append("set training.recompute: full")
    if t is not None and t.micro_batch_size > 1:
        hints.append("lower training.microBatchSize")
    if spec.parallelism.sequence_parallel is False and spec.parallelism.tensor > 1:
        hints.append("turn on parallelism.sequenceParallel")
    return FieldError(
        "spec.resources.gpuMemoryGiB",
        f"the plan needs about {mem.per_gpu_gib:.1f} GiB per GPU (weights and optimizer "
        f"{mem.weights_and_optimizer_gib:.1f}, activations {mem.activations_gib:.1f}, overhead "
        f"{mem.overhead_gib:.1f}"
        + (
            f"; {mem.construction_gib:.1f} while Megatron FSDP builds the model before sharding"
            if mem.construction_gib
            else ""
        )
        + f") but gpuMemoryGiB is {budget:g}: "
        + ", or ".join(hints),
    )
