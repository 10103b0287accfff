"""The resolved trainer configuration (docs/contract.md §2): typed dataclasses, one serialiser, one
parser.

The operator builds these dataclasses and writes them with `to_json`; the trainer reads them back
with `parse_config`, which reports every problem at once, each naming the field. Both directions are
driven by the dataclass fields themselves (their types and `Annotated[..., Meta(...)]` bounds), so a new
config field is one line here plus where its value comes from and where it is used.

JSON keys are the camelCase of the field names (`num_layers` → `numLayers`) unless a field names its
own key (`async_save` → `async`). Every key is required; `X | None` fields may be null.

The launcher reads this module inside any training image (the launcher zipapp, Python 3.8 and
newer): the field types are read from the annotations' text (`_hints`), not with
`typing.get_type_hints`, which cannot evaluate `X | None` or `tuple[X, ...]` before 3.10.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from typing import Annotated  # novermin (not at run time)

from megatron_contract.choices import (
    ACCELERATORS,
    ACTIVATIONS,
    CPU,
    INIT_LOADS,
    LR_DECAY_STYLES,
    MSC_SCHEME,
    NORMALIZATIONS,
    POSITION_EMBEDDINGS,
    PRECISIONS,
    PROFILERS,
    PROGRESS_SOURCES,
    RECOMPUTE,
    ROPE_SCALING_TYPES,
    SHARDING_TYPES,
    TOKEN_DISPATCHERS,
)
from megatron_contract.errors import ConfigError
from megatron_contract.recipes import RECIPE_NAMES

API_VERSION: Final = "megatron.dev/v1alpha1"
KIND: Final = "TrainerConfig"


@dataclass(frozen=True)
class Meta:
    """A field's JSON key (when not the camelCase of its name) and bounds. Integers default to
    a minimum of 1."""

    key: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    what: str = "value"  # how a choice error names the value, e.g. "recipe"


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
    first_k_dense_layers: Annotated[int, Meta(minimum=0)]
    aux_loss_coeff: Annotated[float, Meta(minimum=0.0)]
    token_dispatcher: Annotated[str, Meta(choices=TOKEN_DISPATCHERS)]
    router_pre_softmax: bool  # softmax over all experts, then top-k (DeepSeek-V2)


@dataclass(frozen=True)
class MLAConfig:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class RopeScalingConfig:
    """Llama 3.1's RoPE frequency scaling (Megatron-Core's rope_scaling)."""

    type: Annotated[str, Meta(choices=ROPE_SCALING_TYPES)]
    factor: Annotated[float, Meta(minimum=1.0)]
    low_freq_factor: Annotated[float, Meta(minimum=0.0)]
    high_freq_factor: Annotated[float, Meta(minimum=0.0)]
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    recipe: Annotated[str | None, Meta(choices=RECIPE_NAMES, what="recipe")]
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
    normalization: Annotated[str, Meta(choices=NORMALIZATIONS)]
    activation: Annotated[str, Meta(choices=ACTIVATIONS)]
    position_embedding: Annotated[str, Meta(choices=POSITION_EMBEDDINGS)]
    rope_theta: Annotated[float, Meta(minimum=1.0)]
    untie_embeddings_and_output_weights: bool
    norm_epsilon: Annotated[float, Meta(minimum=0.0)]
    attention_dropout: Annotated[float, Meta(minimum=0.0, maximum=1.0)]
    hidden_dropout: Annotated[float, Meta(minimum=0.0, maximum=1.0)]
    add_bias_linear: bool
    rope_scaling: RopeScalingConfig | None
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
    fsdp: bool  # Megatron FSDP (use_megatron_fsdp): parameters, gradients and optimizer sharded

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of the dense model: tensor × pipeline × context."""
        return self.tensor * self.pipeline * self.context

    @property
    def interleaved(self) -> bool:
        """The interleaved (virtual) pipeline schedule: more than one model chunk per stage."""
        return self.virtual_pipeline is not None and self.virtual_pipeline > 1


@dataclass(frozen=True)
class TrainingConfig:
    global_batch_size: int
    micro_batch_size: int
    num_microbatches: int
    train_iters: int
    lr: Annotated[float, Meta(minimum=0.0)]
    min_lr: Annotated[float, Meta(minimum=0.0)]
    warmup_iters: Annotated[int, Meta(minimum=0)]
    lr_decay_style: Annotated[str, Meta(choices=LR_DECAY_STYLES)]
    weight_decay: Annotated[float, Meta(minimum=0.0)]
    clip_grad: Annotated[float, Meta(minimum=0.0)]
    adam_beta1: Annotated[float, Meta(minimum=0.0, maximum=1.0)]
    adam_beta2: Annotated[float, Meta(minimum=0.0, maximum=1.0)]
    precision: Annotated[str, Meta(choices=PRECISIONS)]
    seed: Annotated[int, Meta(minimum=0)]
    recompute: Annotated[str, Meta(choices=RECOMPUTE)]
    log_interval: int


@dataclass(frozen=True)
class BlendEntry:
    weight: Annotated[float, Meta(minimum=0.0)]
    prefix: str


@dataclass(frozen=True)
class TokenizerConfig:
    path: str


@dataclass(frozen=True)
class DataConfig:
    mock: bool
    blend: tuple[BlendEntry, ...] | None
    tokenizer: TokenizerConfig | None
    split: str
    num_workers: Annotated[int, Meta(minimum=0)]

    @property
    def tokenizer_path(self) -> str | None:
        return self.tokenizer.path if self.tokenizer is not None else None


@dataclass(frozen=True)
class MegatronInit:
    """Start from a Megatron-LM / NeMo torch_dist checkpoint: its weights, or everything."""

    path: str
    load: Annotated[str, Meta(choices=INIT_LOADS)]


@dataclass(frozen=True)
class HuggingFaceInit:
    """Start from a Hugging Face Llama-family directory (config.json + safetensors)."""

    path: str


@dataclass(frozen=True)
class InitConfig:
    """Where the first run starts from; every restart resumes from the job's own checkpoint."""

    megatron: MegatronInit | None
    hugging_face: HuggingFaceInit | None


@dataclass(frozen=True)
class MemoryConfig:
    """The in-memory tiers (megatron_contract/tiers.py): snapshots in the pod's memory volume."""

    dir: str  # the pod's memory volume (tiers.MEMORY_MOUNT in a pod)
    interval: int  # steps between snapshots
    replica: bool  # a copy of each rank's snapshot in the next pod's memory


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str  # an absolute path, or an msc://PROFILE/PATH URL (object storage)
    save_interval: int
    async_save: Annotated[bool, Meta(key="async")]
    keep: Annotated[int, Meta(minimum=0)]  # newest checkpoints kept; 0 keeps all
    sharding_type: Annotated[str, Meta(choices=SHARDING_TYPES)]
    load: bool
    init: InitConfig | None
    memory: MemoryConfig | None  # null: no in-memory tiers


@dataclass(frozen=True)
class ResourcesConfig:
    accelerator: Annotated[str, Meta(choices=ACCELERATORS)]
    nodes: int
    procs_per_node: int


@dataclass(frozen=True)
class ProgressConfig:
    annotation: str
    min_interval_seconds: Annotated[float, Meta(minimum=0.0)]


@dataclass(frozen=True)
class ProfilingConfig:
    tool: Annotated[str, Meta(choices=PROFILERS)]
    start_step: int
    end_step: int
    ranks: Annotated[tuple[int, ...], Meta(minimum=0)]


@dataclass(frozen=True)
class CommandConfig:
    """spec.trainer: the command every rank runs instead of the built-in worker, before the
    launcher expands $(VAR) in it from the rank's env."""

    command: tuple[str, ...]
    args: tuple[str, ...]  # may be empty
    progress: Annotated[str, Meta(choices=PROGRESS_SOURCES)]  # where its progress is read


class _Placed:
    """What TrainerConfig and LaunchConfig derive alike from their resources section."""

    resources: ResourcesConfig

    @property
    def platform(self) -> str:
        """`cpu` (gloo) for accelerator "none", else `cuda` (NCCL)."""
        return "cpu" if self.resources.accelerator == CPU else "cuda"

    @property
    def world_size(self) -> int:
        return self.resources.nodes * self.resources.procs_per_node


@dataclass(frozen=True)
class TrainerConfig(_Placed):
    """The built-in trainer's config: every section present, `trainer` null."""

    job: JobInfo
    model: ModelConfig
    parallelism: ParallelismConfig
    training: TrainingConfig
    data: DataConfig
    checkpoint: CheckpointConfig
    resources: ResourcesConfig
    progress: ProgressConfig
    profiling: ProfilingConfig | None
    trainer: CommandConfig | None

    @property
    def model_json(self) -> dict[str, Any]:
        """The "model" section as JSON, for checkpoint fingerprints."""
        body: dict[str, Any] = to_json(self.model)
        return body


@dataclass(frozen=True)
class LaunchConfig(_Placed):
    """The same document as the launcher reads it, whichever code the ranks run: with a
    trainer.command, model, training and data are null unless the spec gave them (the command
    may read them). The fields are TrainerConfig's (tests/contract checks it)."""

    job: JobInfo
    model: ModelConfig | None
    parallelism: ParallelismConfig
    training: TrainingConfig | None
    data: DataConfig | None
    checkpoint: CheckpointConfig
    resources: ResourcesConfig
    progress: ProgressConfig
    profiling: ProfilingConfig | None
    trainer: CommandConfig | None


# ---------------------------------------------------------------------------------------------
# Serialiser


_NO_META = Meta()


class _Optional:
    """`X | None` (not a dataclass: `dataclasses.is_dataclass` tells config sections apart)."""

    def __init__(self, item: Any) -> None:
        self.item = item


class _Tuple:
    """`tuple[X, ...]`."""

    def __init__(self, item: Any) -> None:
        self.item = item


_FIELDS: dict[type, list[tuple[str, Any, Meta]]] = {}


def _fields(cls: type) -> list[tuple[str, Any, Meta]]:
    """(name, type, Meta) of each field of a config dataclass, `Annotated` unwrapped."""
    if cls not in _FIELDS:
        scope = vars(sys.modules[cls.__module__])
        out = []
        for f in dataclasses.fields(cls):
            tp, meta = _hint(str(f.type), scope)
            out.append((f.name, tp, meta))
        _FIELDS[cls] = out
    return _FIELDS[cls]


def _hint(text: str, scope: dict[str, Any]) -> tuple[Any, Meta]:
    """A field's annotation (its text, as `from __future__ import annotations` keeps it) as a
    type: a class, `_Optional(type)` or `_Tuple(type)`; with the Meta of `Annotated[T, Meta]`."""
    node = ast.parse(text, mode="eval").body
    if isinstance(node, ast.Subscript) and _name(node.value) == "Annotated":
        first, *extras = _subscript_items(node)
        meta = _NO_META
        for extra in extras:  # `Meta(...)` of this module's own source: evaluated as Python does
            value = eval(compile(ast.Expression(extra), "<annotation>", "eval"), scope)
            if isinstance(value, Meta):
                meta = value
        return _type(first, scope), meta
    return _type(node, scope), _NO_META


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _subscript_items(node: ast.Subscript) -> list[ast.expr]:
    inner: Any = node.slice
    inner = getattr(inner, "value", inner) if type(inner).__name__ == "Index" else inner  # 3.8
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _type(node: ast.expr, scope: dict[str, Any]) -> Any:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        kept = [n for n in sides if not (isinstance(n, ast.Constant) and n.value is None)]
        if len(kept) == 1:
            return _Optional(_type(kept[0], scope))
    elif isinstance(node, ast.Subscript) and _name(node.value) == "tuple":
        items = _subscript_items(node)
        if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is ...:
            return _Tuple(_type(items[0], scope))
    elif isinstance(node, ast.Name):
        found = scope.get(node.id, getattr(builtins, node.id, None))
        if isinstance(found, type):
            return found
    raise TypeError(f"the contract cannot read the annotation {ast.dump(node)}")  # a bug here


def json_key(name: str, meta: Meta = _NO_META) -> str:
    if meta.key:
        return meta.key
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def to_json(obj: Any) -> Any:
    """A config dataclass (or a value inside one) as JSON-ready data with camelCase keys."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {json_key(n, m): to_json(getattr(obj, n)) for n, _, m in _fields(type(obj))}
    if isinstance(obj, (tuple, list)):
        return [to_json(v) for v in obj]
    return obj


def config_to_json(cfg: TrainerConfig | LaunchConfig) -> dict[str, Any]:
    """The whole document the trainer reads (apiVersion and kind first)."""
    body: dict[str, Any] = to_json(cfg)
    return {"apiVersion": API_VERSION, "kind": KIND, **body}


def dumps(cfg: TrainerConfig | LaunchConfig) -> str:
    return json.dumps(config_to_json(cfg), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------
# Parser


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


T = TypeVar("T")
_MISSING = object()


class _Reader:
    """Reads JSON into the dataclasses, recording problems instead of raising."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def read_object(self, cls: type[T], data: Any, path: str) -> T | None:
        if not isinstance(data, dict):
            self.fail(path or "config", f"expected a JSON object, got {_describe(data)}")
            return None
        values: dict[str, Any] = {}
        ok = True
        known = set()
        for name, tp, meta in _fields(cls):
            key = json_key(name, meta)
            known.add(key)
            where = f"{path}.{key}" if path else key
            if key not in data:
                self.fail(where, "required field is missing")
                ok = False
                continue
            value = self.read_value(tp, data[key], where, meta)
            if value is _MISSING:
                ok = False
            values[name] = value
        for key in sorted(set(data) - known - ({"apiVersion", "kind"} if not path else set())):
            where = f"{path}.{key}" if path else key
            self.fail(
                where,
                "unknown field (not in docs/contract.md §2); remove it or update the contract "
                "and the trainer together",
            )
        return cls(**values) if ok else None

    def read_value(self, tp: Any, value: Any, path: str, meta: Meta) -> Any:
        if isinstance(tp, _Optional):
            if value is None:
                return None
            return self.read_value(tp.item, value, path, meta)
        if value is None:
            self.fail(path, f"expected {_expected(tp)}, got null")
            return _MISSING
        if dataclasses.is_dataclass(tp):
            result = self.read_object(tp, value, path)  # type: ignore[arg-type]
            return _MISSING if result is None else result
        if isinstance(tp, _Tuple):
            return self.read_tuple(tp.item, value, path, meta)
        if tp is bool:
            if not isinstance(value, bool):
                self.fail(path, f"expected true or false, got {_describe(value)}")
                return _MISSING
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected an integer, got {_describe(value)}")
                return _MISSING
            return self.bounded(value, path, meta, default_minimum=1)
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(path, f"expected a number, got {_describe(value)}")
                return _MISSING
            if not math.isfinite(value):
                self.fail(path, f"expected a finite number, got {value}")
                return _MISSING
            return self.bounded(float(value), path, meta, default_minimum=None)
        if tp is str:
            if not isinstance(value, str) or not value:
                self.fail(path, f"expected a non-empty string, got {_describe(value)}")
                return _MISSING
            if meta.choices is not None and value not in meta.choices:
                allowed = ", ".join(meta.choices)
                self.fail(path, f"unknown {meta.what} {value!r}; use one of: {allowed}")
                return _MISSING
            return value
        raise TypeError(f"{path}: the contract has no reader for {tp!r}")  # a bug in this file

    def read_tuple(self, item: Any, value: Any, path: str, meta: Meta) -> Any:
        if not isinstance(value, list) or (not value and dataclasses.is_dataclass(item)):
            self.fail(path, f"expected a non-empty list, got {_describe(value)}")
            return _MISSING
        items = [self.read_value(item, v, f"{path}[{i}]", meta) for i, v in enumerate(value)]
        return _MISSING if any(v is _MISSING for v in items) else tuple(items)

    def bounded(self, value: float, path: str, meta: Meta, default_minimum: float | None) -> Any:
        low = default_minimum if meta.minimum is None else meta.minimum
        high = meta.maximum
        if low is not None and value < low:
            self.fail(path, f"must be >= {low}, got {value}")
            return _MISSING
        if high is not None and value > high:
            self.fail(path, f"must be <= {high}, got {value}")
            return _MISSING
        return value


def _expected(tp: Any) -> str:
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a non-empty string"
    return "a value"


def _check_values(cfg: TrainerConfig | LaunchConfig, problems: list[str]) -> None:
    """Field checks that are about one value's form (not the layout: that is `rules`)."""
    if not (os.path.isabs(cfg.checkpoint.dir) or is_msc_url(cfg.checkpoint.dir)):
        problems.append(
            f"checkpoint.dir: must be an absolute path or an msc://PROFILE/PATH URL, got "
            f"{cfg.checkpoint.dir!r}"
        )
    split = cfg.data.split if cfg.data is not None else "100,0,0"
    try:
        weights = [float(p) for p in split.split(",")]
    except ValueError:
        weights = []
    if not (len(weights) == 3 and all(w >= 0 for w in weights) and weights[0] > 0):
        problems.append(
            f"data.split: expected three comma-separated numbers like '100,0,0', got {split!r}"
        )
    init = cfg.checkpoint.init
    if init is not None and (init.megatron is None) == (init.hugging_face is None):
        problems.append("checkpoint.init: set exactly one of megatron or huggingFace")
    for where, source in (
        ("megatron", init and init.megatron),
        ("huggingFace", init and init.hugging_face),
    ):
        if source and not (os.path.isabs(source.path) or is_msc_url(source.path)):
            problems.append(
                f"checkpoint.init.{where}.path: must be an absolute path or an msc:// URL, got "
                f"{source.path!r}"
            )
    for i, entry in enumerate(cfg.data.blend or () if cfg.data is not None else ()):
        if entry.weight <= 0.0:
            problems.append(f"data.blend[{i}].weight: must be > 0, got {entry.weight}")


def is_msc_url(path: str) -> bool:
    """`msc://PROFILE/PATH`: a multi-storage-client URL (object storage), not a file path."""
    return path.startswith(MSC_SCHEME) and "/" in path[len(MSC_SCHEME) :].strip("/")


C = TypeVar("C", TrainerConfig, LaunchConfig)


def _parse(cls: type[C], data: Any) -> C:
    reader = _Reader()
    if isinstance(data, dict):
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            if data.get(key) != want:
                reader.fail(key, f"expected {want!r}, got {_describe(data.get(key))}")
    cfg = reader.read_object(cls, data, "")
    if cfg is not None:
        _check_values(cfg, reader.problems)
    if reader.problems or cfg is None:
        raise ConfigError(reader.problems or ["config: could not be parsed"])
    return cfg


def parse_config(data: Any) -> TrainerConfig:
    """Parse the built-in trainer's config (decoded JSON). Raises ConfigError with every
    problem, one of them when the config is a trainer.command's (no model, training or data)."""
    if isinstance(data, dict) and data.get("trainer") is not None:
        raise ConfigError(
            ["trainer: set (spec.trainer.command): the launcher runs that command, not the worker"]
        )
    return _parse(TrainerConfig, data)


def parse_launch_config(data: Any) -> LaunchConfig:
    """Parse the config as the launcher reads it (sections may be null with a trainer.command)."""
    cfg = _parse(LaunchConfig, data)
    if cfg.trainer is None:
        missing = [k for k in ("model", "training", "data") if getattr(cfg, k) is None]
        if missing:
            raise ConfigError(
                [f"{k}: required without trainer (the built-in trainer)" for k in missing]
            )
    return cfg


def read_config(path: str | os.PathLike[str]) -> Any:
    """Read the resolved config file's JSON. Raises ConfigError naming the problem."""
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
    return data


def load_config(path: str | os.PathLike[str]) -> TrainerConfig:
    """Read and parse the built-in trainer's config file. Raises ConfigError naming the problem."""
    return parse_config(read_config(path))


def load_launch_config(path: str | os.PathLike[str]) -> LaunchConfig:
    """Read and parse the config file as the launcher reads it."""
    return parse_launch_config(read_config(path))
