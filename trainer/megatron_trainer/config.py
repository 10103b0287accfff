"""The trainer's inputs: the resolved config JSON and the contract env (docs/contract.md).

This module is pure Python (no torch) so the launcher can validate a job in milliseconds and a
contract test can feed the operator's rendered pod straight into `load_config` / `runtime_env`.
Every problem names the field and the fix; all problems are reported at once.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Exit codes of `python -m megatron_trainer` (contract §3).
EXIT_OK = 0
EXIT_CONFIG = 78  # EX_CONFIG: the operator fails the job at once
EXIT_SIGTERM = 143  # 128 + SIGTERM: checkpoint saved, clean exit; "restart, not counted"

DEFAULT_CONFIG_PATH = "/etc/megatron/config.json"

# Recipes the operator ships (issue 2). The renderer resolves them; we only reject names we do not
# know, so a typo'd or stale recipe fails fast instead of training something unintended.
KNOWN_RECIPES = frozenset(
    {"gpt-tiny", "llama3-8b", "llama3-70b", "mixtral-8x7b", "deepseek-v2-lite"}
)

NORMALIZATIONS = ("RMSNorm", "LayerNorm")
ACTIVATIONS = ("swiglu", "gelu", "squared_relu")
POSITION_EMBEDDINGS = ("rope", "learned_absolute")
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
RECOMPUTE = ("none", "selective", "full")
LR_DECAY_STYLES = ("cosine", "linear", "constant", "inverse-square-root")
TOKEN_DISPATCHERS = ("alltoall", "allgather")
SHARDING_TYPES = ("dp_reshardable", "fully_reshardable")
CPU_ACCELERATOR = "none"


class ConfigError(Exception):
    """A configuration problem the user must fix; exits with EXIT_CONFIG."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    def __str__(self) -> str:
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"invalid trainer configuration ({len(self.problems)} problem(s)):\n{lines}"


# ---------------------------------------------------------------------------------------------
# Dataclasses (snake_case mirrors of the camelCase JSON)


@dataclass(frozen=True)
class JobInfo:
    name: str
    namespace: str
    uid: str | None  # null when rendered without a cluster (`mjob render`)


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    router_top_k: int
    ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int | None
    first_k_dense_layers: int
    aux_loss_coeff: float
    token_dispatcher: str


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelConfig:
    recipe: str | None
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    padded_vocab_size: int
    seq_length: int
    max_position_embeddings: int
    normalization: str
    activation: str
    position_embedding: str
    rope_theta: float
    untie_embeddings_and_output_weights: bool
    norm_epsilon: float
    attention_dropout: float
    hidden_dropout: float
    add_bias_linear: bool
    moe: MoEConfig | None
    mla: MLAConfig | None


@dataclass(frozen=True)
class ParallelismConfig:
    tensor: int
    pipeline: int
    virtual_pipeline: int | None  # model chunks per pipeline rank (Megatron's VPP size)
    context: int
    expert: int
    expert_tensor: int
    data: int
    expert_data: int
    sequence_parallel: bool


@dataclass(frozen=True)
class TrainingConfig:
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int
    train_iters: int
    lr: float
    min_lr: float
    warmup_iters: int
    lr_decay_style: str
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    precision: str
    seed: int
    recompute: str
    log_interval: int


@dataclass(frozen=True)
class BlendEntry:
    weight: float
    prefix: str


@dataclass(frozen=True)
class DataConfig:
    mock: bool
    blend: tuple[BlendEntry, ...] | None
    tokenizer_path: str | None
    split: str
    num_workers: int


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str
    save_interval: int
    async_save: bool
    keep: int  # newest checkpoints kept; 0 keeps all
    sharding_type: str
    load: bool


@dataclass(frozen=True)
class ResourcesConfig:
    accelerator: str
    nodes: int
    procs_per_node: int


@dataclass(frozen=True)
class ProgressConfig:
    annotation: str
    min_interval_seconds: float


@dataclass(frozen=True)
class ProfilingConfig:
    start_step: int
    end_step: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class TrainerConfig:
    job: JobInfo
    model: ModelConfig
    parallelism: ParallelismConfig
    training: TrainingConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    resources: ResourcesConfig
    progress: ProgressConfig
    profiling: ProfilingConfig | None
    model_json: Mapping[str, Any]  # the "model" section as written, for checkpoint fingerprints

    @property
    def platform(self) -> str:
        """`cpu` (gloo) for accelerator "none", else `cuda` (NCCL)."""
        return "cpu" if self.resources.accelerator == CPU_ACCELERATOR else "cuda"

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.procs_per_node


# ---------------------------------------------------------------------------------------------
# Reading JSON with field-naming errors


class _Section:
    """Reads one JSON object, recording problems under its dotted path instead of raising."""

    def __init__(self, data: Any, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        self.data: dict[str, Any] = data if isinstance(data, dict) else {}
        self.seen: set[str] = set()
        if not isinstance(data, dict):
            problems.append(f"{path}: expected a JSON object, got {_describe(data)}")

    def _field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str) -> tuple[bool, Any]:
        self.seen.add(key)
        if key not in self.data:
            self.problems.append(f"{self._field(key)}: required field is missing")
            return False, None
        return True, self.data[key]

    def integer(self, key: str, minimum: int | None = 1, nullable: bool = False) -> Any:
        ok, value = self._get(key)
        if not ok or (nullable and value is None):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "an integer or null" if nullable else "an integer"
            self.problems.append(f"{self._field(key)}: expected {kind}, got {_describe(value)}")
            return None
        if minimum is not None and value < minimum:
            self.problems.append(f"{self._field(key)}: must be >= {minimum}, got {value}")
            return None
        return value

    def number(self, key: str, minimum: float | None = None, maximum: float | None = None) -> Any:
        ok, value = self._get(key)
        if not ok:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            self.problems.append(f"{self._field(key)}: expected a number, got {_describe(value)}")
            return None
        if minimum is not None and value < minimum:
            self.problems.append(f"{self._field(key)}: must be >= {minimum}, got {value}")
            return None
        if maximum is not None and value > maximum:
            self.problems.append(f"{self._field(key)}: must be <= {maximum}, got {value}")
            return None
        return float(value)

    def flag(self, key: str) -> Any:
        ok, value = self._get(key)
        if ok and not isinstance(value, bool):
            self.problems.append(
                f"{self._field(key)}: expected true or false, got {_describe(value)}"
            )
            return None
        return value

    def text(self, key: str, choices: tuple[str, ...] | None = None, nullable: bool = False) -> Any:
        ok, value = self._get(key)
        if not ok or (nullable and value is None):
            return None
        if not isinstance(value, str) or not value:
            self.problems.append(
                f"{self._field(key)}: expected a non-empty string, got {_describe(value)}"
            )
            return None
        if choices is not None and value not in choices:
            allowed = ", ".join(choices)
            self.problems.append(f"{self._field(key)}: {value!r} is not one of: {allowed}")
            return None
        return value

    def section(self, key: str, nullable: bool = False) -> _Section | None:
        ok, value = self._get(key)
        if not ok or (nullable and value is None):
            return None
        return _Section(value, self._field(key), self.problems)

    def raw(self, key: str) -> Any:
        ok, value = self._get(key)
        return value if ok else None

    def finish(self) -> None:
        """Unknown keys are contract drift between renderer and trainer: name them."""
        for key in sorted(set(self.data) - self.seen):
            self.problems.append(
                f"{self._field(key)}: unknown field (not in docs/contract.md §2); "
                "remove it or update the contract and the trainer together"
            )


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _all_present(*values: Any) -> bool:
    return all(v is not None for v in values)


def parse_config(data: Any) -> TrainerConfig:
    """Parse the resolved config (already decoded JSON). Raises ConfigError with every problem."""
    problems: list[str] = []
    root = _Section(data, "", problems)
    api_version = root.text("apiVersion")
    if api_version is not None and api_version != "megatron.dev/v1alpha1":
        problems.append(f"apiVersion: expected 'megatron.dev/v1alpha1', got {api_version!r}")
    kind = root.text("kind")
    if kind is not None and kind != "TrainerConfig":
        problems.append(f"kind: expected 'TrainerConfig', got {kind!r}")
    sections = {
        name: root.section(name)
        for name in (
            "job",
            "model",
            "parallelism",
            "training",
            "data",
            "checkpoint",
            "resources",
            "progress",
        )
    }
    profiling_section = root.section("profiling", nullable=True)
    root.finish()
    if any(s is None for s in sections.values()):
        raise ConfigError(problems)
    job = _parse_job(_req(sections["job"]))
    model = _parse_model(_req(sections["model"]))
    parallelism = _parse_parallelism(_req(sections["parallelism"]))
    training = _parse_training(_req(sections["training"]))
    data_cfg = _parse_data(_req(sections["data"]))
    checkpoint = _parse_checkpoint(_req(sections["checkpoint"]))
    resources = _parse_resources(_req(sections["resources"]))
    progress = _parse_progress(_req(sections["progress"]))
    profiling = _parse_profiling(profiling_section) if profiling_section else None
    parts = (job, model, parallelism, training, data_cfg, checkpoint, resources, progress)
    if problems or not _all_present(*parts):
        raise ConfigError(problems or ["config: could not be parsed"])
    assert job and model and parallelism and training and data_cfg and checkpoint  # for mypy
    assert resources and progress
    model_json = data["model"] if isinstance(data, dict) else {}
    return TrainerConfig(
        job=job,
        model=model,
        parallelism=parallelism,
        training=training,
        data=data_cfg,
        checkpoint=checkpoint,
        resources=resources,
        progress=progress,
        profiling=profiling,
        model_json=dict(model_json),
    )


def _req(section: _Section | None) -> _Section:
    assert section is not None
    return section


def _parse_job(s: _Section) -> JobInfo | None:
    name, namespace, uid = s.text("name"), s.text("namespace"), s.raw("uid")
    s.finish()
    if uid is not None and not isinstance(uid, str):
        s.problems.append(f"job.uid: expected a string or null, got {_describe(uid)}")
        return None
    return JobInfo(name, namespace, uid) if _all_present(name, namespace) else None


def _parse_model(s: _Section) -> ModelConfig | None:
    recipe = s.text("recipe", nullable=True)
    if recipe is not None and recipe not in KNOWN_RECIPES:
        known = ", ".join(sorted(KNOWN_RECIPES))
        s.problems.append(f"model.recipe: unknown recipe {recipe!r}; known recipes: {known}")
    fields = {
        "num_layers": s.integer("numLayers"),
        "hidden_size": s.integer("hiddenSize"),
        "ffn_hidden_size": s.integer("ffnHiddenSize"),
        "num_attention_heads": s.integer("numAttentionHeads"),
        "num_query_groups": s.integer("numQueryGroups"),
        "kv_channels": s.integer("kvChannels"),
        "vocab_size": s.integer("vocabSize"),
        "padded_vocab_size": s.integer("paddedVocabSize"),
        "seq_length": s.integer("seqLength"),
        "max_position_embeddings": s.integer("maxPositionEmbeddings"),
        "normalization": s.text("normalization", NORMALIZATIONS),
        "activation": s.text("activation", ACTIVATIONS),
        "position_embedding": s.text("positionEmbedding", POSITION_EMBEDDINGS),
        "rope_theta": s.number("ropeTheta", minimum=1.0),
        "untie_embeddings_and_output_weights": s.flag("untieEmbeddingsAndOutputWeights"),
        "norm_epsilon": s.number("normEpsilon", minimum=0.0),
        "attention_dropout": s.number("attentionDropout", minimum=0.0, maximum=1.0),
        "hidden_dropout": s.number("hiddenDropout", minimum=0.0, maximum=1.0),
        "add_bias_linear": s.flag("addBiasLinear"),
    }
    moe_s = s.section("moe", nullable=True)
    mla_s = s.section("mla", nullable=True)
    s.finish()
    moe = _parse_moe(moe_s) if moe_s else None
    mla = _parse_mla(mla_s) if mla_s else None
    if not _all_present(*fields.values()) or (moe_s and not moe) or (mla_s and not mla):
        return None
    return ModelConfig(recipe=recipe, moe=moe, mla=mla, **fields)


def _parse_moe(s: _Section) -> MoEConfig | None:
    fields = {
        "num_experts": s.integer("numExperts"),
        "router_top_k": s.integer("routerTopK"),
        "ffn_hidden_size": s.integer("ffnHiddenSize"),
        "shared_expert_ffn_hidden_size": s.integer("sharedExpertFfnHiddenSize", nullable=True),
        "first_k_dense_layers": s.integer("firstKDenseLayers", minimum=0),
        "aux_loss_coeff": s.number("auxLossCoeff", minimum=0.0),
        "token_dispatcher": s.text("tokenDispatcher", TOKEN_DISPATCHERS),
    }
    s.finish()
    required = {k: v for k, v in fields.items() if k != "shared_expert_ffn_hidden_size"}
    return MoEConfig(**fields) if _all_present(*required.values()) else None


def _parse_mla(s: _Section) -> MLAConfig | None:
    fields = {
        "q_lora_rank": s.integer("qLoraRank", nullable=True),
        "kv_lora_rank": s.integer("kvLoraRank"),
        "qk_head_dim": s.integer("qkHeadDim"),
        "qk_pos_emb_head_dim": s.integer("qkPosEmbHeadDim"),
        "v_head_dim": s.integer("vHeadDim"),
    }
    s.finish()
    required = {k: v for k, v in fields.items() if k != "q_lora_rank"}
    return MLAConfig(**fields) if _all_present(*required.values()) else None


def _parse_parallelism(s: _Section) -> ParallelismConfig | None:
    fields = {
        "tensor": s.integer("tensor"),
        "pipeline": s.integer("pipeline"),
        "virtual_pipeline": s.integer("virtualPipeline", nullable=True),
        "context": s.integer("context"),
        "expert": s.integer("expert"),
        "expert_tensor": s.integer("expertTensor"),
        "data": s.integer("data"),
        "expert_data": s.integer("expertData"),
        "sequence_parallel": s.flag("sequenceParallel"),
    }
    s.finish()
    required = {k: v for k, v in fields.items() if k != "virtual_pipeline"}
    return ParallelismConfig(**fields) if _all_present(*required.values()) else None


def _parse_training(s: _Section) -> TrainingConfig | None:
    fields = {
        "global_batch_size": s.integer("globalBatchSize"),
        "micro_batch_size": s.integer("microBatchSize"),
        "num_microbatches": s.integer("numMicrobatches"),
        "train_iters": s.integer("trainIters"),
        "lr": s.number("lr", minimum=0.0),
        "min_lr": s.number("minLr", minimum=0.0),
        "warmup_iters": s.integer("warmupIters", minimum=0),
        "lr_decay_style": s.text("lrDecayStyle", LR_DECAY_STYLES),
        "weight_decay": s.number("weightDecay", minimum=0.0),
        "clip_grad": s.number("clipGrad", minimum=0.0),
        "adam_beta1": s.number("adamBeta1", minimum=0.0, maximum=1.0),
        "adam_beta2": s.number("adamBeta2", minimum=0.0, maximum=1.0),
        "precision": s.text("precision", PRECISIONS),
        "seed": s.integer("seed", minimum=0),
        "recompute": s.text("recompute", RECOMPUTE),
        "log_interval": s.integer("logInterval"),
    }
    s.finish()
    return TrainingConfig(**fields) if _all_present(*fields.values()) else None


def _parse_data(s: _Section) -> DataConfig | None:
    mock = s.flag("mock")
    blend_raw = s.raw("blend")
    tokenizer = s.section("tokenizer", nullable=True)
    split = s.text("split")
    num_workers = s.integer("numWorkers", minimum=0)
    s.finish()
    blend: tuple[BlendEntry, ...] | None = None
    if blend_raw is not None:
        if not isinstance(blend_raw, list) or not blend_raw:
            s.problems.append("data.blend: expected a non-empty list of {weight, prefix} or null")
        else:
            entries = []
            for i, item in enumerate(blend_raw):
                e = _Section(item, f"data.blend[{i}]", s.problems)
                weight, prefix = e.number("weight", minimum=0.0), e.text("prefix")
                e.finish()
                if weight is not None and weight <= 0.0:
                    s.problems.append(f"data.blend[{i}].weight: must be > 0, got {weight}")
                elif _all_present(weight, prefix):
                    entries.append(BlendEntry(weight, prefix))
            blend = tuple(entries)
    tokenizer_path = None
    if tokenizer is not None:
        tokenizer_path = tokenizer.text("path")
        tokenizer.finish()
    if split is not None and not _valid_split(split):
        s.problems.append(
            f"data.split: expected three comma-separated numbers like '100,0,0', got {split!r}"
        )
    if not _all_present(mock, split, num_workers):
        return None
    return DataConfig(mock, blend, tokenizer_path, split, num_workers)


def _valid_split(split: str) -> bool:
    parts = split.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return False
    return len(values) == 3 and all(v >= 0 for v in values) and values[0] > 0


def _parse_checkpoint(s: _Section) -> CheckpointConfig | None:
    fields = {
        "dir": s.text("dir"),
        "save_interval": s.integer("saveInterval"),
        "async_save": s.flag("async"),
        "keep": s.integer("keep", minimum=0),  # 0 keeps every checkpoint
        "sharding_type": s.text("shardingType", SHARDING_TYPES),
        "load": s.flag("load"),
    }
    s.finish()
    directory = fields["dir"]
    if directory is not None and not os.path.isabs(directory):
        s.problems.append(f"checkpoint.dir: must be an absolute path, got {directory!r}")
        return None
    return CheckpointConfig(**fields) if _all_present(*fields.values()) else None


def _parse_resources(s: _Section) -> ResourcesConfig | None:
    fields = {
        "accelerator": s.text("accelerator"),
        "nodes": s.integer("nodes"),
        "procs_per_node": s.integer("procsPerNode"),
    }
    s.finish()
    return ResourcesConfig(**fields) if _all_present(*fields.values()) else None


def _parse_progress(s: _Section) -> ProgressConfig | None:
    annotation = s.text("annotation")
    interval = s.number("minIntervalSeconds", minimum=0.0)
    s.finish()
    return ProgressConfig(annotation, interval) if _all_present(annotation, interval) else None


def _parse_profiling(s: _Section) -> ProfilingConfig | None:
    start, end = s.integer("startStep"), s.integer("endStep")
    ranks_raw = s.raw("ranks")
    s.finish()
    if not isinstance(ranks_raw, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks_raw
    ):
        s.problems.append("profiling.ranks: expected a list of non-negative rank numbers")
        return None
    if start is not None and end is not None and end < start:
        s.problems.append(f"profiling.endStep ({end}) must be >= profiling.startStep ({start})")
        return None
    return ProfilingConfig(start, end, tuple(ranks_raw)) if _all_present(start, end) else None


def load_config(path: str | os.PathLike[str]) -> TrainerConfig:
    """Read and parse the resolved config file. Raises ConfigError naming the problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(
            [f"MEGATRON_CONFIG: cannot read {str(p)!r} ({err.strerror}); mount the resolved config"]
        ) from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            [f"{p}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})"]
        ) from err
    return parse_config(data)


# ---------------------------------------------------------------------------------------------
# The env contract (§1)


@dataclass(frozen=True)
class FailureInjection:
    """Kill one rank after it completes `step` (MEGATRON_INJECT_FAILURE, for tests and demos)."""

    step: int
    rank: int
    signal: str  # "KILL" or "TERM"


@dataclass(frozen=True)
class RuntimeEnv:
    master_addr: str
    master_port: int
    world_size: int
    nnodes: int
    node_rank: int
    nproc_per_node: int
    config_path: str
    job_name: str | None
    pod_name: str | None
    pod_namespace: str | None
    restart_attempt: int
    progress_file: str | None
    report_to_pod: bool
    inject_failures: tuple[FailureInjection, ...]

    def global_rank(self, local_rank: int) -> int:
        """Ranks are contiguous per node, so TP groups (innermost) stay inside one pod."""
        return self.node_rank * self.nproc_per_node + local_rank


def runtime_env(environ: Mapping[str, str]) -> RuntimeEnv:
    """Parse the contract env. Raises ConfigError naming every missing or malformed variable."""
    problems: list[str] = []

    def integer(name: str, minimum: int, default: int | None = None) -> int | None:
        raw = environ.get(name)
        if raw is None or raw == "":
            if default is None:
                problems.append(f"{name}: required environment variable is not set")
            return default
        try:
            value = int(raw)
        except ValueError:
            problems.append(f"{name}: expected an integer, got {raw!r}")
            return None
        if value < minimum:
            problems.append(f"{name}: must be >= {minimum}, got {value}")
            return None
        return value

    master_addr = environ.get("MASTER_ADDR", "")
    if not master_addr:
        problems.append("MASTER_ADDR: required environment variable is not set")
    master_port = integer("MASTER_PORT", 1, default=29500)
    if master_port is not None and master_port > 65535:
        problems.append(f"MASTER_PORT: must be a TCP port (1-65535), got {master_port}")
    world_size = integer("WORLD_SIZE", 1)
    nnodes = integer("NNODES", 1)
    node_rank = integer("NODE_RANK", 0)
    nproc = integer("NPROC_PER_NODE", 1)
    restart_attempt = integer("MEGATRON_RESTART_ATTEMPT", 0, default=0)
    sizes_known = world_size is not None and nnodes is not None and nproc is not None
    if sizes_known and world_size != nnodes * nproc:  # type: ignore[operator]
        problems.append(
            f"WORLD_SIZE ({world_size}) must equal NNODES ({nnodes}) × NPROC_PER_NODE ({nproc})"
        )
    if node_rank is not None and nnodes is not None and node_rank >= nnodes:
        problems.append(f"NODE_RANK ({node_rank}) must be < NNODES ({nnodes})")
    report = environ.get("MEGATRON_REPORT_TO_POD", "false").strip().lower()
    if report not in ("true", "false", ""):
        problems.append(f"MEGATRON_REPORT_TO_POD: expected 'true' or 'false', got {report!r}")
    injections = _parse_injections(environ.get("MEGATRON_INJECT_FAILURE", ""), problems)
    if problems:
        raise ConfigError(problems)
    assert master_port is not None and world_size is not None and nnodes is not None
    assert node_rank is not None and nproc is not None and restart_attempt is not None
    return RuntimeEnv(
        master_addr=master_addr,
        master_port=master_port,
        world_size=world_size,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        config_path=environ.get("MEGATRON_CONFIG") or DEFAULT_CONFIG_PATH,
        job_name=environ.get("MEGATRON_JOB_NAME") or None,
        pod_name=environ.get("POD_NAME") or None,
        pod_namespace=environ.get("POD_NAMESPACE") or None,
        restart_attempt=restart_attempt,
        progress_file=environ.get("MEGATRON_PROGRESS_FILE") or None,
        report_to_pod=report == "true",
        inject_failures=injections,
    )


def _parse_injections(raw: str, problems: list[str]) -> tuple[FailureInjection, ...]:
    """`STEP[:RANK[:SIGNAL]]`, comma-separated; the same syntax as `mjob run --inject-failure`."""
    result = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        parts = item.split(":")
        try:
            step = int(parts[0])
            rank = int(parts[1]) if len(parts) > 1 and parts[1] else 0
        except ValueError:
            step = rank = -1
        signal = (parts[2] if len(parts) > 2 else "KILL").upper().removeprefix("SIG")
        if len(parts) > 3 or step < 1 or rank < 0 or signal not in ("KILL", "TERM"):
            problems.append(
                f"MEGATRON_INJECT_FAILURE: {item!r} is not STEP[:RANK[:KILL|TERM]] "
                "(step >= 1, rank >= 0)"
            )
            continue
        result.append(FailureInjection(step, rank, signal))
    return tuple(result)
