"""Recipe + overrides → a fully resolved model (pure): the contract's `ModelConfig`.

The result is what the trainer receives: no field is left to a default on the trainer's side. The
defaults for fields the spec leaves out are the `_DEFAULTS` below (a recipe may set its own).
"""

from __future__ import annotations

from typing import Any

from megatron_contract.config import MLAConfig, ModelConfig, MoEConfig, RopeScalingConfig
from megatron_contract.recipes import RECIPES
from megatron_operator.api.errors import FieldError
from megatron_operator.api.spec import ModelSpec

_REQUIRED = ("numLayers", "hiddenSize", "numAttentionHeads", "vocabSize", "seqLength")


def merged_model_fields(spec: ModelSpec) -> dict[str, Any]:
    """The recipe's fields with the explicitly given ones on top (camelCase keys)."""
    base: dict[str, Any] = dict(RECIPES[spec.recipe]) if spec.recipe else {}
    given = spec.to_api()
    given.pop("recipe", None)
    for key in ("moe", "mla"):
        if key in given and isinstance(base.get(key), dict):
            given[key] = {**base[key], **given[key]}
    return {**base, **given}


def resolve_model(spec: ModelSpec, tensor: int) -> tuple[ModelConfig | None, list[FieldError]]:
    """Resolve the model (its vocabulary padded for `tensor`), or say what is missing."""
    m = merged_model_fields(spec)
    missing = [k for k in _REQUIRED if k not in m]
    if missing:
        hint = "set them or choose a model.recipe"
        return None, [
            FieldError(f"spec.model.{k}", f"required when model.recipe is not set: {hint}")
            for k in missing
        ]
    heads, hidden = m["numAttentionHeads"], m["hiddenSize"]
    moe, mla = m.get("moe"), m.get("mla")
    if moe is not None:
        absent = [k for k in ("numExperts", "routerTopK") if k not in moe]
        if absent:
            return None, [
                FieldError(f"spec.model.moe.{k}", "required: the recipe is not an MoE model")
                for k in absent
            ]
    errors: list[FieldError] = []
    if "kvChannels" not in m and hidden % heads:
        # The model still resolves (kvChannels rounded down), so the layout rules run too.
        errors.append(
            FieldError(
                "spec.model.hiddenSize",
                f"hiddenSize ({hidden}) is not divisible by numAttentionHeads ({heads}): set "
                "model.kvChannels or change one of them",
            )
        )
    ffn = m.get("ffnHiddenSize", 4 * hidden)
    resolved = ModelConfig(
        recipe=spec.recipe,
        num_layers=m["numLayers"],
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=m.get("numQueryGroups", heads),
        kv_channels=m.get("kvChannels", max(hidden // heads, 1)),
        vocab_size=m["vocabSize"],
        padded_vocab_size=padded_vocab_size(m["vocabSize"], tensor),
        seq_length=m["seqLength"],
        max_position_embeddings=m.get("maxPositionEmbeddings", m["seqLength"]),
        normalization=m.get("normalization", "RMSNorm"),
        activation=m.get("activation", "swiglu"),
        position_embedding=m.get("positionEmbedding", "rope"),
        rope_theta=float(m.get("ropeTheta", 10000.0)),
        untie_embeddings_and_output_weights=m.get("untieEmbeddingsAndOutputWeights", True),
        norm_epsilon=float(m.get("normEpsilon", 1e-5)),
        # Dropout is off: it is rarely used for pretraining, and its masks depend on the
        # layout, which would break loss equality across TP/PP/DP layouts.
        attention_dropout=0.0,
        hidden_dropout=0.0,
        add_bias_linear=False,
        rope_scaling=_resolve_rope_scaling(m.get("ropeScaling")),
        moe=_resolve_moe(moe, ffn) if moe else None,
        mla=_resolve_mla(mla) if mla else None,
    )
    return resolved, errors


def _resolve_moe(moe: dict[str, Any], dense_ffn: int) -> MoEConfig:
    return MoEConfig(
        num_experts=moe["numExperts"],
        router_top_k=moe["routerTopK"],
        ffn_hidden_size=moe.get("ffnHiddenSize", dense_ffn),
        shared_expert_ffn_hidden_size=moe.get("sharedExpertFfnHiddenSize"),
        first_k_dense_layers=moe.get("firstKDenseLayers", 0),
        aux_loss_coeff=float(moe.get("auxLossCoeff", 0.01)),
        token_dispatcher=moe.get("tokenDispatcher", "alltoall"),
        router_pre_softmax=moe.get("routerPreSoftmax", False),
    )


def _resolve_rope_scaling(scaling: dict[str, Any] | None) -> RopeScalingConfig | None:
    if not scaling:
        return None
    return RopeScalingConfig(
        type=scaling["type"],
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling.get("lowFreqFactor", 1.0)),
        high_freq_factor=float(scaling.get("highFreqFactor", 4.0)),
        original_max_position_embeddings=scaling.get("originalMaxPositionEmbeddings", 8192),
    )


def _resolve_mla(mla: dict[str, Any]) -> MLAConfig:
    return MLAConfig(
        q_lora_rank=mla.get("qLoraRank"),
        kv_lora_rank=mla["kvLoraRank"],
        qk_head_dim=mla["qkHeadDim"],
        qk_pos_emb_head_dim=mla["qkPosEmbHeadDim"],
        v_head_dim=mla["vHeadDim"],
    )


def padded_vocab_size(vocab_size: int, tensor: int, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of 128·TP so the embedding splits evenly."""
    multiple = divisible_by * tensor
    return -(-vocab_size // multiple) * multiple
