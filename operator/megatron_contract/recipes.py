"""Built-in model presets ("recipes"). Explicit fields in `spec.model` override them.

Values follow the published model configurations. The CRD's CEL rules read this table too
(`megatron_operator.api.cel`), so server-side validation knows a recipe's defaults without a webhook,
and the trainer checks a config's recipe name against it.
"""

from __future__ import annotations

from typing import Any, Final

_LLAMA3_COMMON: Final[dict[str, Any]] = {
    "numQueryGroups": 8,
    "vocabSize": 128256,
    "seqLength": 8192,
    "maxPositionEmbeddings": 8192,
    "normalization": "RMSNorm",
    "activation": "swiglu",
    "positionEmbedding": "rope",
    "ropeTheta": 500000.0,
    "untieEmbeddingsAndOutputWeights": True,
    "normEpsilon": 1e-5,
}

RECIPES: Final[dict[str, dict[str, Any]]] = {
    # Small enough to train on two CPU processes in seconds; used by CI and `mjob run --local`.
    "gpt-tiny": {
        "numLayers": 4,
        "hiddenSize": 128,
        "ffnHiddenSize": 352,
        "numAttentionHeads": 4,
        "numQueryGroups": 2,
        "vocabSize": 1024,
        "seqLength": 128,
        "maxPositionEmbeddings": 128,
        "normalization": "RMSNorm",
        "activation": "swiglu",
        "positionEmbedding": "rope",
        "ropeTheta": 10000.0,
        "untieEmbeddingsAndOutputWeights": True,
        "normEpsilon": 1e-5,
    },
    "llama3-8b": {
        **_LLAMA3_COMMON,
        "numLayers": 32,
        "hiddenSize": 4096,
        "ffnHiddenSize": 14336,
        "numAttentionHeads": 32,
    },
    "llama3-70b": {
        **_LLAMA3_COMMON,
        "numLayers": 80,
        "hiddenSize": 8192,
        "ffnHiddenSize": 28672,
        "numAttentionHeads": 64,
    },
    "mixtral-8x7b": {
        "numLayers": 32,
        "hiddenSize": 4096,
        "ffnHiddenSize": 14336,
        "numAttentionHeads": 32,
        "numQueryGroups": 8,
        "vocabSize": 32000,
        "seqLength": 4096,
        "maxPositionEmbeddings": 32768,
        "normalization": "RMSNorm",
        "activation": "swiglu",
        "positionEmbedding": "rope",
        "ropeTheta": 1000000.0,
        "untieEmbeddingsAndOutputWeights": True,
        "normEpsilon": 1e-5,
        "moe": {"numExperts": 8, "routerTopK": 2, "ffnHiddenSize": 14336},
    },
    # DeepSeek-V2-Lite: multi-latent attention, 64 routed experts (top-6, chosen after a softmax
    # over all 64 scores, not renormalised) plus 2 shared, and a dense first layer. Its 4K
    # pre-training context uses plain RoPE; the YaRN scaling of the released weights (to 32K)
    # came after pre-training, and this trainer refuses it by name (model.ropeScaling).
    "deepseek-v2-lite": {
        "numLayers": 27,
        "hiddenSize": 2048,
        "ffnHiddenSize": 10944,
        "numAttentionHeads": 16,
        "numQueryGroups": 16,
        "kvChannels": 128,
        "vocabSize": 102400,
        "seqLength": 4096,
        "maxPositionEmbeddings": 4096,
        "normalization": "RMSNorm",
        "activation": "swiglu",
        "positionEmbedding": "rope",
        "ropeTheta": 10000.0,
        "untieEmbeddingsAndOutputWeights": True,
        "normEpsilon": 1e-6,
        "moe": {
            "numExperts": 64,
            "routerTopK": 6,
            "ffnHiddenSize": 1408,
            "sharedExpertFfnHiddenSize": 2816,
            "firstKDenseLayers": 1,
            "routerPreSoftmax": True,
        },
        "mla": {
            "kvLoraRank": 512,
            "qkHeadDim": 128,
            "qkPosEmbHeadDim": 64,
            "vHeadDim": 128,
        },
    },
}

RECIPE_NAMES: Final[tuple[str, ...]] = tuple(RECIPES)
