"""`mjob export --hf CHECKPOINT_DIR --output DIR [--iteration N]`: our checkpoint -> Hugging Face.

Reads one torch_dist checkpoint this trainer wrote, at whatever tensor/pipeline layout it was
saved, in this one process (no process group: torch.distributed.checkpoint reads every shard of
the model tensors into full tensors), and writes a Llama-family Hugging Face directory:
`config.json` plus `model.safetensors` (or `model-0000i-of-0000n.safetensors` shards and
`model.safetensors.index.json` above `--max-shard-size`). The optimizer state is not read.

No generation_config.json is written: its token ids belong to the tokenizer, which the
checkpoint does not record.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from megatron_contract.config import is_msc_url

from .hf import CONFIG_FILE, INDEX_FILE, SINGLE_FILE

# torch_dist keys of the model tensors (Megatron-Core's checkpoint names: layers are stacked on a
# leading axis, and the norms use the Transformer Engine names for either layer spec).
EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
LAYER_KEYS = {
    "input_layernorm": "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
    "qkv": "decoder.layers.self_attention.linear_qkv.weight",
    "o_proj": "decoder.layers.self_attention.linear_proj.weight",
    "post_attention_layernorm": "decoder.layers.mlp.linear_fc1.layer_norm_weight",
    "fc1": "decoder.layers.mlp.linear_fc1.weight",
    "down_proj": "decoder.layers.mlp.linear_fc2.weight",
}
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ExportError(Exception):
    """Why a checkpoint cannot be exported; the message names the problem and the fix."""


# ---------------------------------------------------------------------------------------------
# Finding and reading the checkpoint


def checkpoint_path(checkpoint_dir: str | Path, iteration: int | None = None) -> str:
    """The complete `iter_XXXXXXX` directory to export: `iteration`, or the tracker's newest.
    `checkpoint_dir` is a directory or an msc:// URL (MSC_CONFIG names the MSC config)."""
    from .checkpoint import TRACKER, incomplete_reason, iteration_path, read_tracker, scan
    from .storage import storage_for

    root = str(checkpoint_dir)
    store = storage_for(root)
    if not store.is_dir(root):
        raise ExportError(f"{root}: no such directory")
    if iteration is None:
        iteration = read_tracker(root)
        if iteration is None:
            raise ExportError(
                f"{root}: no readable {TRACKER}; pass the job's checkpoint directory (the one "
                "holding it), or choose a checkpoint with --iteration N"
            )
    path = iteration_path(root, iteration)
    if not store.is_dir(path):
        found = ", ".join(str(i) for i in scan(root).complete) or "none"
        name = path.rstrip("/").rsplit("/", 1)[-1]
        raise ExportError(
            f"{root}: iteration {iteration} has no checkpoint ({name} is missing); "
            f"complete checkpoints: {found}"
        )
    reason = incomplete_reason(path)
    if reason is not None:
        raise ExportError(f"{path}: incomplete checkpoint: {reason}")
    from megatron_contract.paths import FSDP_DTENSOR

    from .checkpoint import format_of

    if format_of(path) == FSDP_DTENSOR:
        raise ExportError(
            f"{path}: an fsdp_dtensor checkpoint (Megatron FSDP): mjob export reads the "
            "torch_dist format only (a job without parallelism.fsdp saves it)"
        )
    return path


def read_trainer_metadata(path: str | Path) -> dict[str, Any]:
    """The `trainer` record our trainer stores in common.pt (model fields, layout, iteration)."""
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    from .storage import use_msc

    use_msc(str(path))
    common = TorchCommonLoadStrategy().load_common(path if is_msc_url(str(path)) else Path(path))
    saved = common.get("trainer") if isinstance(common, Mapping) else None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ExportError(
            f"{path}: not written by this trainer (common.pt has no 'trainer' record); only "
            "checkpoints of MegatronJobs can be exported"
        )
    return saved


def read_full_tensors(path: str | Path, keys: list[str]) -> dict[str, torch.Tensor]:
    """The full (unsharded) tensors `keys` of a torch_dist checkpoint, without a process group."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    from .safe_metadata import safe_reader

    reader = safe_reader(str(path))
    metadata = reader.read_metadata().state_dict_metadata
    state: dict[str, torch.Tensor] = {}
    for key in keys:
        info = metadata.get(key)
        if not isinstance(info, TensorStorageMetadata):
            raise ExportError(f"{path}: the checkpoint has no tensor {key!r}")
        state[key] = torch.empty(info.size, dtype=info.properties.dtype)
    with warnings.catch_warnings():
        # torch warns that it "assumes" a single process even when told so with no_dist.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load(state, storage_reader=reader, no_dist=True)
    return state


# ---------------------------------------------------------------------------------------------
# Megatron -> Hugging Face


def check_exportable(model: Mapping[str, Any], where: str | Path) -> None:
    """ExportError unless the checkpoint's model is a dense Llama-family GPT."""
    problems = []
    if model.get("moe") is not None:
        problems.append("it is a mixture-of-experts model (model.moe)")
    if model.get("mla") is not None:
        problems.append("it uses multi-latent attention (model.mla)")
    expected = {
        "normalization": "RMSNorm",
        "activation": "swiglu",
        "positionEmbedding": "rope",
        "addBiasLinear": False,
    }
    for key, value in expected.items():
        if model.get(key) != value:
            problems.append(f"model.{key} is {model.get(key)!r}, Llama needs {value!r}")
    if problems:
        raise ExportError(
            f"{where}: cannot export as a Hugging Face Llama model: {'; '.join(problems)}"
        )


def _rope(model: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE's parameters as transformers names them: plain, or Llama 3.1's scaling."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": model["ropeTheta"]}
    scaling = model.get("ropeScaling")
    if scaling:
        out.update(
            rope_type="llama3",
            factor=scaling["factor"],
            low_freq_factor=scaling["lowFreqFactor"],
            high_freq_factor=scaling["highFreqFactor"],
            original_max_position_embeddings=scaling["originalMaxPositionEmbeddings"],
        )
    return out


def hf_config(model: Mapping[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """config.json of LlamaForCausalLM for our model fields (camelCase, as in the spec)."""
    rope = _rope(model)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model["hiddenSize"],
        "intermediate_size": model["ffnHiddenSize"],
        "num_hidden_layers": model["numLayers"],
        "num_attention_heads": model["numAttentionHeads"],
        "num_key_value_heads": model["numQueryGroups"],
        "head_dim": model["kvChannels"],
        "vocab_size": model["vocabSize"],
        "max_position_embeddings": model["maxPositionEmbeddings"],
        "rms_norm_eps": model["normEpsilon"],
        # Both spellings: transformers 4.x reads rope_theta and rope_scaling, 5.x
        # rope_parameters.
        "rope_theta": model["ropeTheta"],
        "rope_scaling": rope if rope["rope_type"] != "default" else None,
        "rope_parameters": rope,
        "tie_word_embeddings": not model["untieEmbeddingsAndOutputWeights"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "torch_dtype": _DTYPE_NAMES.get(dtype, "float32"),  # 4.x
        "dtype": _DTYPE_NAMES.get(dtype, "float32"),  # 5.x
    }


def split_qkv(fused: torch.Tensor, model: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """Megatron's per-group [q heads, k, v] rows back into q_proj, k_proj, v_proj."""
    groups, d = model["numQueryGroups"], model["kvChannels"]
    per_group = model["numAttentionHeads"] // groups
    hidden = fused.shape[-1]
    grouped = fused.reshape(groups, (per_group + 2) * d, hidden)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return tuple(t.reshape(-1, hidden).contiguous() for t in (q, k, v))


def to_hf_tensors(full: Mapping[str, torch.Tensor], model: Mapping[str, Any]) -> dict[str, Any]:
    """Hugging Face names -> tensors, from our full (unsharded, layer-stacked) tensors."""
    vocab, ffn = model["vocabSize"], model["ffnHiddenSize"]
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": full[EMBEDDING][:vocab].contiguous(),
        "model.norm.weight": full[FINAL_NORM].contiguous(),
    }
    if model["untieEmbeddingsAndOutputWeights"]:
        out["lm_head.weight"] = full[OUTPUT][:vocab].contiguous()
    for layer in range(model["numLayers"]):
        prefix = f"model.layers.{layer}."
        q, k, v = split_qkv(full[LAYER_KEYS["qkv"]][layer], model)
        fc1 = full[LAYER_KEYS["fc1"]][layer]
        out.update(
            {
                prefix + "input_layernorm.weight": full[LAYER_KEYS["input_layernorm"]][layer],
                prefix + "self_attn.q_proj.weight": q,
                prefix + "self_attn.k_proj.weight": k,
                prefix + "self_attn.v_proj.weight": v,
                prefix + "self_attn.o_proj.weight": full[LAYER_KEYS["o_proj"]][layer],
                prefix + "post_attention_layernorm.weight": full[
                    LAYER_KEYS["post_attention_layernorm"]
                ][layer],
                prefix + "mlp.gate_proj.weight": fc1[:ffn],
                prefix + "mlp.up_proj.weight": fc1[ffn:],
                prefix + "mlp.down_proj.weight": full[LAYER_KEYS["down_proj"]][layer],
            }
        )
    # safetensors stores each tensor whole: no views sharing (or padding) storage.
    return {name: t.contiguous().clone() for name, t in out.items()}


# ---------------------------------------------------------------------------------------------
# Writing


def write_safetensors(
    tensors: Mapping[str, torch.Tensor], output_dir: Path, max_shard_bytes: int
) -> list[str]:
    """model.safetensors, or shards plus the index when the total exceeds `max_shard_bytes`."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(output_dir / SINGLE_FILE), metadata=metadata)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file, shard in zip(names, shards, strict=True):
        save_file(shard, str(output_dir / file), metadata=metadata)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (output_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return names


def export_hf(
    checkpoint_dir: str | Path,
    output_dir: str | Path,
    iteration: int | None = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> str:
    """Write the checkpoint at `iteration` (default: the newest, by the tracker) of a job's
    checkpoint directory as a Hugging Face Llama directory in `output_dir`; returns the
    checkpoint directory read. ExportError names the problem for anything it cannot export."""
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: the output directory is not empty; choose a new one")
    path = checkpoint_path(checkpoint_dir, iteration)
    model = read_trainer_metadata(path)["model"]
    check_exportable(model, path)
    keys = [EMBEDDING, FINAL_NORM, *LAYER_KEYS.values()]
    if model["untieEmbeddingsAndOutputWeights"]:
        keys.append(OUTPUT)
    full = read_full_tensors(path, keys)
    tensors = to_hf_tensors(full, model)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, out, max_shard_bytes)
    config = hf_config(model, full[EMBEDDING].dtype)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mjob export", description="Export a MegatronJob checkpoint as a Hugging Face model."
    )
    parser.add_argument("--hf", metavar="CHECKPOINT_DIR", required=True,
                        help="the job's checkpoint directory (holding latest_checkpointed_iteration.txt), or its msc:// URL")  # fmt: skip
    parser.add_argument("--output", metavar="DIR", required=True, help="new directory to write")
    parser.add_argument("--iteration", type=int, default=None,
                        help="checkpoint iteration to export (default: the newest)")  # fmt: skip
    parser.add_argument("--max-shard-size", type=int, default=DEFAULT_MAX_SHARD_BYTES,
                        metavar="BYTES", help="split safetensors files above this size")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        path = export_hf(args.hf, args.output, args.iteration, max_shard_bytes=args.max_shard_size)
    except ExportError as err:
        print(f"mjob export: error: {err}", file=sys.stderr)
        return 2
    print(f"exported {path} to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
