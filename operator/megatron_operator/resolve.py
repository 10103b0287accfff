"""Recipe + overrides → a fully resolved model (pure).

The result is what the trainer receives: no field is left to a default on the trainer's side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .api.errors import FieldError
from .api.recipes import RECIPES
from .api.spec import ModelSpec

_REQUIRED = ("numLayers", "hiddenSize", "numAttentionHeads", "vocabSize", "seqLength")


@dataclass(frozen=True)
class ResolvedMoe:
    num_experts: int
    router_top_k: int
    ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int | None
    first_k_dense_layers: int
    aux_loss_coeff: float
    token_dispatcher: str


@dataclass(frozen=True)
class ResolvedMla:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ResolvedModel:
    recipe: str | None
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    kv_channels_explicit: bool
    vocab_size: int
    seq_length: int
    max_position_embeddings: int
    normalization: str
    activation: str
    position_embedding: str
    rope_theta: float
    untie_embeddings_and_output_weights: bool
    norm_epsilon: float
    moe: ResolvedMoe | None
    mla: ResolvedMla | None

    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"


def merged_model_fields(spec: ModelSpec) -> dict[str, Any]:
    """The recipe's fields with the explicitly given ones on top (camelCase keys)."""
    base: dict[str, Any] = dict(RECIPES[spec.recipe]) if spec.recipe else {}
    given = spec.to_api()
    given.pop("recipe", None)
    for key in ("moe", "mla"):
        if key in given and isinstance(base.get(key), dict):
            given[key] = {**base[key], **given[key]}
    return {**base, **given}


def resolve_model(spec: ModelSpec) -> tuple[ResolvedModel | None, list[FieldError]]:
    """Resolve the model, or report which required fields are missing."""
    m = merged_model_fields(spec)
    missing = [k for k in _REQUIRED if k not in m]
    if missing:
        hint = "set them or choose a model.recipe"
        return None, [
            FieldError(f"spec.model.{k}", f"required when model.recipe is not set: {hint}")
            for k in missing
        ]
    heads = m["numAttentionHeads"]
    hidden = m["hiddenSize"]
    kv_explicit = "kvChannels" in m
    moe = m.get("moe")
    mla = m.get("mla")
    if moe is not None:
        absent = [k for k in ("numExperts", "routerTopK") if k not in moe]
        if absent:
            return None, [
                FieldError(f"spec.model.moe.{k}", "required: the recipe is not an MoE model")
                for k in absent
            ]
    resolved = ResolvedModel(
        recipe=spec.recipe,
        num_layers=m["numLayers"],
        hidden_size=hidden,
        ffn_hidden_size=m.get("ffnHiddenSize", 4 * hidden),
        num_attention_heads=heads,
        num_query_groups=m.get("numQueryGroups", heads),
        kv_channels=m["kvChannels"] if kv_explicit else max(hidden // heads, 1),
        kv_channels_explicit=kv_explicit,
        vocab_size=m["vocabSize"],
        seq_length=m["seqLength"],
        max_position_embeddings=m.get("maxPositionEmbeddings", m["seqLength"]),
        normalization=m.get("normalization", "RMSNorm"),
        activation=m.get("activation", "swiglu"),
        position_embedding=m.get("positionEmbedding", "rope"),
        rope_theta=float(m.get("ropeTheta", 10000.0)),
        untie_embeddings_and_output_weights=m.get("untieEmbeddingsAndOutputWeights", True),
        norm_epsilon=float(m.get("normEpsilon", 1e-5)),
        moe=_resolve_moe(moe, m.get("ffnHiddenSize", 4 * hidden)) if moe else None,
        mla=_resolve_mla(mla) if mla else None,
    )
    return resolved, []


def _resolve_moe(moe: dict[str, Any], dense_ffn: int) -> ResolvedMoe:
    return ResolvedMoe(
        num_experts=moe["numExperts"],
        router_top_k=moe["routerTopK"],
        ffn_hidden_size=moe.get("ffnHiddenSize", dense_ffn),
        shared_expert_ffn_hidden_size=moe.get("sharedExpertFfnHiddenSize"),
        first_k_dense_layers=moe.get("firstKDenseLayers", 0),
        aux_loss_coeff=float(moe.get("auxLossCoeff", 0.01)),
        token_dispatcher=moe.get("tokenDispatcher", "alltoall"),
    )


def _resolve_mla(mla: dict[str, Any]) -> ResolvedMla:
    return ResolvedMla(
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
