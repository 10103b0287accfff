"""Resolved trainer configs like the renderer writes them (docs/contract.md §2), for the tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

GPT_TINY: dict[str, Any] = {
    "apiVersion": "megatron.dev/v1alpha1",
    "kind": "TrainerConfig",
    "job": {"name": "tiny", "namespace": "default", "uid": "00000000-0000-0000-0000-000000000000"},
    "model": {
        "recipe": "gpt-tiny", "numLayers": 4, "hiddenSize": 128, "ffnHiddenSize": 352,
        "numAttentionHeads": 4, "numQueryGroups": 2, "kvChannels": 32,
        "vocabSize": 1024, "paddedVocabSize": 1024, "seqLength": 128, "maxPositionEmbeddings": 128,
        "normalization": "RMSNorm", "activation": "swiglu", "positionEmbedding": "rope",
        "ropeTheta": 10000.0, "untieEmbeddingsAndOutputWeights": True, "normEpsilon": 1e-5,
        "attentionDropout": 0.0, "hiddenDropout": 0.0, "addBiasLinear": False, "ropeScaling": None,
        "moe": None, "mla": None,
    },
    "parallelism": {"tensor": 1, "pipeline": 1, "virtualPipeline": None, "context": 1,
                    "expert": 1, "expertTensor": 1, "data": 1, "expertData": 1,
                    "sequenceParallel": False, "fsdp": False},
    "training": {"globalBatchSize": 8, "microBatchSize": 2, "numMicrobatches": 4,
                 "trainIters": 10, "lr": 0.001, "minLr": 0.0001, "warmupIters": 2,
                 "lrDecayStyle": "cosine", "weightDecay": 0.01, "clipGrad": 1.0,
                 "adamBeta1": 0.9, "adamBeta2": 0.95, "precision": "fp32", "seed": 1234,
                 "recompute": "none", "logInterval": 1},
    "data": {"mock": True, "blend": None, "tokenizer": None, "split": "100,0,0", "numWorkers": 0},
    "checkpoint": {"dir": "/tmp/unset", "saveInterval": 5, "async": False, "keep": 3,
                   "shardingType": "dp_reshardable", "load": True, "init": None,
                   "memory": None},
    "resources": {"accelerator": "none", "nodes": 1, "procsPerNode": 1},
    "progress": {"annotation": "megatron.dev/progress", "minIntervalSeconds": 10},
    "profiling": None,
    "trainer": None,
}  # fmt: skip

# gpt-tiny's MoE variant that runs on CPU (allgather dispatcher), as the tests that train it and
# docs/trainer.md's Megatron-LM flags (`megatron-lm: moe`) spell it.
TINY_MOE: dict[str, Any] = {
    "numExperts": 4, "routerTopK": 2, "ffnHiddenSize": 176, "sharedExpertFfnHiddenSize": 128,
    "firstKDenseLayers": 1, "auxLossCoeff": 0.01, "tokenDispatcher": "allgather",
    "routerPreSoftmax": False,
}  # fmt: skip


def tiny_config(
    checkpoint_dir: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    vpp: int | None = None,
    nodes: int = 1,
    save_interval: int = 5,
    **training: Any,
) -> dict[str, Any]:
    """gpt-tiny on CPU with the given layout; world = tp·pp·dp ranks on `nodes` pods.
    `training` overrides fields of the training section (camelCase)."""
    cfg = copy.deepcopy(GPT_TINY)
    world = tp * pp * dp
    cfg["parallelism"].update(
        tensor=tp, pipeline=pp, data=dp, virtualPipeline=vpp, expertTensor=tp, expertData=dp
    )
    cfg["resources"].update(nodes=nodes, procsPerNode=world // nodes)
    cfg["training"]["numMicrobatches"] = cfg["training"]["globalBatchSize"] // (
        cfg["training"]["microBatchSize"] * dp
    )
    cfg["training"].update(training)
    cfg["checkpoint"].update(dir=str(checkpoint_dir), saveInterval=save_interval)
    return cfg


def write_config(cfg: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(cfg, indent=2))
    return path
