"""Hugging Face Llama-family weights in and out of Megatron-Core GPTModel chunks.

`check_hf_config` is pure (no torch import), so the launcher can run it before any rank starts.

One table (`hf_names`) says which Hugging Face tensor each of our parameters comes from; import
(`load_hf_into_model`) and export (export.py) both use it, so they cannot drift apart.

Our tensors differ from Hugging Face's in three ways, all handled here:
- `linear_qkv` fuses q, k and v per query group: for each group its query heads, then its key
  head, then its value head, rows of `kv_channels` each. Tensor parallelism splits that fused
  tensor by whole groups, so a rank reads only its groups' rows of q_proj, k_proj and v_proj.
- `linear_fc1` fuses SwiGLU's gate and up projections. Each tensor-parallel rank holds its share
  of gate rows followed by its share of up rows (Megatron's MLP chunks the output in two).
- the embedding and output layer have `paddedVocabSize` rows; rows past `vocabSize` are zero.

Names: Megatron-Core's Transformer Engine spec fuses the input and pre-MLP norms into the next
linear (`linear_qkv.layer_norm_weight`, `linear_fc1.layer_norm_weight`); the local spec keeps
them apart (`input_layernorm.weight`, `pre_mlp_layernorm.weight`). Both map to the same tensors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megatron_contract.config import ModelConfig
from megatron_contract.errors import ConfigError

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Families whose checkpoints are LlamaForCausalLM tensor for tensor (Mistral without a sliding
# window is the same architecture under another name).
LLAMA_MODEL_TYPES = ("llama", "mistral")


# ---------------------------------------------------------------------------------------------
# config.json


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    """The parsed config.json of `hf_dir`. ConfigError naming the file when it is missing or bad."""
    path = Path(hf_dir) / CONFIG_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(
            [f"{path}: cannot read the Hugging Face config ({err.strerror}); the path must be "
             "a Hugging Face model directory with config.json and *.safetensors"]
        ) from err  # fmt: skip
    except json.JSONDecodeError as err:
        raise ConfigError([f"{path}: not valid JSON (line {err.lineno}: {err.msg})"]) from err
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a JSON object"])
    return data


def hf_rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base: `rope_theta` (transformers 4.x) or `rope_parameters.rope_theta` (5.x)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(hf.get("rope_theta", 10000.0))


def hf_rope_scaling(hf: dict[str, Any]) -> dict[str, Any] | None:
    """The RoPE scaling parameters (rope_parameters in 5.x, rope_scaling in 4.x), or None for
    plain RoPE."""
    for key in ("rope_parameters", "rope_scaling"):
        value = hf.get(key)
        if isinstance(value, dict) and value.get("rope_type", value.get("type", "default")) != (
            "default"
        ):
            return value
    return None


# Our spec's llama3 fields → Hugging Face's keys.
_LLAMA3_KEYS = {
    "factor": "factor",
    "lowFreqFactor": "low_freq_factor",
    "highFreqFactor": "high_freq_factor",
    "originalMaxPositionEmbeddings": "original_max_position_embeddings",
}


def _rope_scaling_problems(model: ModelConfig, hf: dict[str, Any], where: str) -> list[str]:
    """llama3 scaling (Llama 3.1) must match spec.model.ropeScaling; other kinds are refused."""
    theirs = hf_rope_scaling(hf)
    ours = model.rope_scaling
    if theirs is None:
        if ours is not None:
            return [f"spec.model.ropeScaling is set but {where} has plain RoPE: remove it"]
        return []
    kind = theirs.get("rope_type", theirs.get("type"))
    if kind != "llama3":
        return [
            f"{where}: RoPE scaling {kind!r} is not supported (llama3 is); use a model "
            "without it, or one with Llama 3.1's scaling"
        ]
    try:
        wanted = {ours_key: float(theirs[key]) for ours_key, key in _LLAMA3_KEYS.items()}
    except (KeyError, TypeError, ValueError) as err:
        return [f"{where}: rope_scaling llama3 is missing or malforms a field ({err})"]
    spec = ", ".join(f"{k}: {v:g}" for k, v in wanted.items())
    if ours is None:
        return [f"{where} has Llama 3.1's RoPE scaling: set spec.model.ropeScaling to "
                f"{{type: llama3, {spec}}}"]  # fmt: skip
    have = {
        "factor": ours.factor,
        "lowFreqFactor": ours.low_freq_factor,
        "highFreqFactor": ours.high_freq_factor,
        "originalMaxPositionEmbeddings": float(ours.original_max_position_embeddings),
    }
    return [
        f"spec.model.ropeScaling.{k} is {have[k]:g} but {where} has {_LLAMA3_KEYS[k]} "
        f"{wanted[k]:g}: set it to {wanted[k]:g}"
        for k in _LLAMA3_KEYS
        if have[k] != wanted[k]
    ]


def hf_head_dim(hf: dict[str, Any]) -> int:
    head_dim = hf.get("head_dim")
    if isinstance(head_dim, int):
        return head_dim
    return int(hf["hidden_size"]) // int(hf["num_attention_heads"])


def check_hf_config(model: ModelConfig, hf_dir: str | Path) -> list[str]:
    """Every way `model` differs from the Hugging Face model in `hf_dir` (empty: they match).

    Each problem names our field (`spec.model.<camelCase>`) and the Hugging Face value, so the
    user can fix the spec. The trainer exits 78 on any. A missing or unreadable config.json is a
    problem too, not an exception.
    """
    try:
        hf = read_hf_config(hf_dir)
    except ConfigError as err:
        return list(err.problems)
    where = f"{Path(hf_dir) / CONFIG_FILE}"
    model_type = hf.get("model_type")
    if model_type not in LLAMA_MODEL_TYPES:
        return [
            f"{where}: model_type {model_type!r} is not supported; checkpoint.init.huggingFace "
            f"takes the Llama family ({', '.join(LLAMA_MODEL_TYPES)}: LlamaForCausalLM)"
        ]
    problems: list[str] = []

    def compare(field: str, ours: Any, hf_key: str, theirs: Any) -> None:
        if ours != theirs:
            problems.append(
                f"spec.model.{field} is {ours!r} but {where} has {hf_key} {theirs!r}: "
                f"set spec.model.{field} to {theirs!r}"
            )

    try:
        heads = int(hf["num_attention_heads"])
        compare("hiddenSize", model.hidden_size, "hidden_size", int(hf["hidden_size"]))
        compare("ffnHiddenSize", model.ffn_hidden_size, "intermediate_size",
                int(hf["intermediate_size"]))  # fmt: skip
        compare("numLayers", model.num_layers, "num_hidden_layers", int(hf["num_hidden_layers"]))
        compare("numAttentionHeads", model.num_attention_heads, "num_attention_heads", heads)
        compare("numQueryGroups", model.num_query_groups, "num_key_value_heads",
                int(hf.get("num_key_value_heads") or heads))  # fmt: skip
        compare("kvChannels", model.kv_channels, "head_dim", hf_head_dim(hf))
        compare("vocabSize", model.vocab_size, "vocab_size", int(hf["vocab_size"]))
        compare("normEpsilon", model.norm_epsilon, "rms_norm_eps", float(hf["rms_norm_eps"]))
        compare("ropeTheta", model.rope_theta, "rope_theta", hf_rope_theta(hf))
        compare("maxPositionEmbeddings", model.max_position_embeddings,
                "max_position_embeddings", int(hf["max_position_embeddings"]))  # fmt: skip
        # LlamaConfig's default is untied.
        compare("untieEmbeddingsAndOutputWeights", model.untie_embeddings_and_output_weights,
                "tie_word_embeddings (negated)", not hf.get("tie_word_embeddings", False))  # fmt: skip
    except (KeyError, TypeError, ValueError) as err:
        problems.append(f"{where}: missing or malformed field ({type(err).__name__}: {err})")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        problems.append(f"{where}: hidden_act {act!r} is not supported (Llama uses 'silu')")
    if model.activation != "swiglu":
        problems.append(
            f"spec.model.activation is {model.activation!r} but {where} has hidden_act 'silu' "
            "with a gated MLP: set spec.model.activation to 'swiglu'"
        )
    if model.normalization != "RMSNorm":
        problems.append(
            f"spec.model.normalization is {model.normalization!r} but Llama uses RMSNorm: set "
            "spec.model.normalization to 'RMSNorm'"
        )
    if model.position_embedding != "rope":
        problems.append(
            f"spec.model.positionEmbedding is {model.position_embedding!r} but Llama uses RoPE: "
            "set spec.model.positionEmbedding to 'rope'"
        )
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            problems.append(f"{where}: {key} true is not supported (biases are not imported)")
    if model.add_bias_linear:
        problems.append(
            f"spec.model.addBiasLinear is true but {where} has no linear biases: set it to false"
        )
    if model.moe is not None:
        problems.append(
            f"spec.model.moe is set but {where} is a dense model: remove spec.model.moe"
        )
    if model.mla is not None:
        problems.append(f"spec.model.mla is set but {where} uses standard attention: remove it")
    problems += _rope_scaling_problems(model, hf, where)
    if hf.get("sliding_window") is not None and model_type == "mistral":
        problems.append(f"{where}: sliding_window attention is not supported")
    return problems


# ---------------------------------------------------------------------------------------------
# The name table


@dataclass(frozen=True)
class Source:
    """Where one of our parameters comes from on the Hugging Face side."""

    kind: str  # "vocab", "qkv", "fc1", "row" (split by columns under TP), "norm"
    names: tuple[str, ...]  # HF tensor names, in fusion order (q, k, v / gate, up)


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LAYER_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "input_layernorm.weight": ("norm", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.layer_norm_weight": ("norm", ("input_layernorm.weight",)),
    "self_attention.linear_qkv.weight": (
        "qkv", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    ),
    "self_attention.linear_proj.weight": ("row", ("self_attn.o_proj.weight",)),
    "pre_mlp_layernorm.weight": ("norm", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.layer_norm_weight": ("norm", ("post_attention_layernorm.weight",)),
    "mlp.linear_fc1.weight": ("fc1", ("mlp.gate_proj.weight", "mlp.up_proj.weight")),
    "mlp.linear_fc2.weight": ("row", ("mlp.down_proj.weight",)),
}  # fmt: skip


def hf_names(name: str, global_layer: int | None, tied: bool) -> Source:
    """The Hugging Face source of our parameter `name` (a GPTModel parameter name).

    `global_layer` (0-based) replaces the local layer index of `decoder.layers.<i>.` names: a
    pipeline stage numbers its layers from 0. ValueError for a name with no Llama counterpart.
    """
    if name == "embedding.word_embeddings.weight":
        return Source("vocab", ("model.embed_tokens.weight",))
    if name == "output_layer.weight":
        return Source("vocab", ("model.embed_tokens.weight" if tied else "lm_head.weight",))
    if name == "decoder.final_layernorm.weight":
        return Source("norm", ("model.norm.weight",))
    match = _LAYER.match(name)
    if match and match.group(2) in _LAYER_SOURCES:
        layer = int(match.group(1)) if global_layer is None else global_layer
        kind, suffixes = _LAYER_SOURCES[match.group(2)]
        return Source(kind, tuple(f"model.layers.{layer}.{s}" for s in suffixes))
    raise ValueError(f"parameter {name!r} has no Hugging Face Llama counterpart")


# ---------------------------------------------------------------------------------------------
# Reading safetensors


class SafetensorsDir:
    """Lazy, slice-wise access to the tensors of a Hugging Face directory (sharded or not).

    Only what is sliced is read from disk (safetensors maps the file; a row range is one
    contiguous read), so a rank reads its own shard of each tensor and nothing else.
    """

    def __init__(self, hf_dir: str | Path) -> None:
        self.dir = Path(hf_dir)
        index = self.dir / INDEX_FILE
        single = self.dir / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ConfigError([f"{index}: not a safetensors index ({err})"]) from err
            self.files: dict[str, str] = dict(weight_map)
        elif single.is_file():
            self.files = {}
            with self._open(single) as f:
                self.files = dict.fromkeys(f.keys(), SINGLE_FILE)
        else:
            raise ConfigError(
                [f"{self.dir}: neither {SINGLE_FILE} nor {INDEX_FILE} is there; only safetensors "
                 "checkpoints are read (convert .bin files with transformers' save_pretrained)"]
            )  # fmt: skip
        self._stack = ExitStack()
        self._handles: dict[str, Any] = {}

    @staticmethod
    def _open(path: Path) -> Any:
        from safetensors import safe_open

        return safe_open(str(path), framework="pt")

    def __enter__(self) -> SafetensorsDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def slice(self, name: str) -> Any:
        """A safetensors slice of `name` (index it to read: `s[a:b]`, `s[:, a:b]`)."""
        if name not in self.files:
            raise ConfigError([f"{self.dir}: tensor {name!r} is missing from the checkpoint"])
        file = self.files[name]
        if file not in self._handles:
            path = self.dir / file
            if not path.is_file():
                raise ConfigError([f"{path}: listed in {INDEX_FILE} but missing"])
            self._handles[file] = self._stack.enter_context(self._open(path))
        return self._handles[file].get_slice(name)

    def shape(self, name: str) -> list[int]:
        return list(self.slice(name).get_shape())

    def read(
        self,
        name: str,
        rows: tuple[int, int] | None = None,
        columns: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Tensor `name`, or its `rows` / `columns` range [first, last): only those are read."""
        r = slice(*rows) if rows else slice(None)
        if columns is None:
            tensor: torch.Tensor = self.slice(name)[r]
        else:
            tensor = self.slice(name)[r, slice(*columns)]
        return tensor


# ---------------------------------------------------------------------------------------------
# Import


@dataclass(frozen=True)
class Shard:
    """This rank's piece of tensor-parallel parameters."""

    rank: int
    size: int


def _rows(total: int, shard: Shard) -> tuple[int, int]:
    per = total // shard.size
    return shard.rank * per, (shard.rank + 1) * per


def read_local(
    source: Source, hf: SafetensorsDir, model: ModelConfig, shard: Shard
) -> torch.Tensor:
    """This TP rank's piece of our parameter, built from the Hugging Face tensors it needs."""
    import torch

    if source.kind == "norm":
        return hf.read(source.names[0])
    if source.kind == "vocab":
        first, last = _rows(model.padded_vocab_size, shard)
        name = source.names[0]
        vocab = hf.shape(name)[0]
        rows = hf.read(name, rows=(min(first, vocab), min(last, vocab)))
        local = rows.new_zeros(last - first, rows.shape[1])  # rows past the vocabulary: padding
        local[: rows.shape[0]] = rows
        return local
    if source.kind == "row":
        columns = hf.shape(source.names[0])[1]
        return hf.read(source.names[0], columns=_rows(columns, shard))
    if source.kind == "fc1":
        gate, up = source.names
        ffn_rows = _rows(model.ffn_hidden_size, shard)
        return torch.cat([hf.read(gate, rows=ffn_rows), hf.read(up, rows=ffn_rows)])
    if source.kind == "qkv":
        return _local_qkv(source, hf, model, shard)
    raise AssertionError(source.kind)


def _local_qkv(
    source: Source, hf: SafetensorsDir, model: ModelConfig, shard: Shard
) -> torch.Tensor:
    import torch

    groups = model.num_query_groups
    if groups % shard.size:
        raise ConfigError(
            [f"spec.model.numQueryGroups ({groups}) must be divisible by parallelism.tensor "
             f"({shard.size}) to import Hugging Face attention weights"]
        )  # fmt: skip
    d = model.kv_channels
    per_group = model.num_attention_heads // groups  # query heads per key/value head
    g0, g1 = _rows(groups, shard)
    q_name, k_name, v_name = source.names
    q = hf.read(q_name, rows=(g0 * per_group * d, g1 * per_group * d))
    k = hf.read(k_name, rows=(g0 * d, g1 * d))
    v = hf.read(v_name, rows=(g0 * d, g1 * d))
    local_groups, hidden = g1 - g0, q.shape[-1]
    fused = torch.cat(
        [
            q.reshape(local_groups, per_group * d, hidden),
            k.reshape(local_groups, d, hidden),
            v.reshape(local_groups, d, hidden),
        ],
        dim=1,
    )
    return fused.reshape(-1, hidden)


def unwrap(chunk: Any) -> Any:
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def global_layer_numbers(gpt: Any) -> dict[int, int]:
    """Local layer index -> global 0-based layer number, for one model chunk."""
    if not hasattr(gpt, "decoder"):
        return {}
    return {i: layer.layer_number - 1 for i, layer in enumerate(gpt.decoder.layers)}


def local_parameters(gpt: Any) -> Iterator[tuple[str, torch.nn.Parameter, int | None]]:
    """(name, parameter, global layer or None) for each parameter of one GPTModel chunk."""
    layers = global_layer_numbers(gpt)
    for name, param in gpt.named_parameters():
        match = _LAYER.match(name)
        yield name, param, layers[int(match.group(1))] if match else None


def load_hf_into_model(model_chunks: list[Any], hf_dir: str | Path, config: ModelConfig) -> int:
    """Copy the Hugging Face Llama weights in `hf_dir` into this rank's model chunks.

    Works at any tensor/pipeline/virtual-pipeline layout: each chunk's parameters are named
    locally, mapped to their global layer, and filled with this tensor-parallel rank's piece,
    read from disk slice by slice. Collective-free: every rank reads what it needs.

    Call it after `build_model` and before the optimizer is built, or call the optimizer's
    `reload_model_params()` afterwards (the distributed optimizer keeps fp32 main copies).
    Check the config first with `check_hf_config`. Returns the number of parameters filled;
    raises ConfigError (exit 78) for a missing tensor or a shape that does not fit.
    """
    import torch
    from megatron.core import parallel_state

    shard = Shard(
        parallel_state.get_tensor_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_world_size(),
    )
    tied = not config.untie_embeddings_and_output_weights
    filled = 0
    with SafetensorsDir(hf_dir) as hf, torch.no_grad():
        for chunk in model_chunks:
            for name, param, layer in local_parameters(unwrap(chunk)):
                try:
                    source = hf_names(name, layer, tied)
                except ValueError as err:
                    raise ConfigError([f"{hf_dir}: {err}"]) from err
                local = read_local(source, hf, config, shard)
                if tuple(local.shape) != tuple(param.shape):
                    raise ConfigError(
                        [f"{hf_dir}: {' + '.join(source.names)} gives {tuple(local.shape)} for "
                         f"our {name} of shape {tuple(param.shape)} (tensor rank {shard.rank} "
                         f"of {shard.size}); the model config does not match the weights"]
                    )  # fmt: skip
                param.data.copy_(local)
                filled += 1
    return filled
