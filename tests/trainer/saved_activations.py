"""Bytes autograd keeps for the backward pass of Megatron-Core transformer layers, on CPU.

Run as `python -m tests.trainer.saved_activations CASES.json` (its own process: it initialises
torch.distributed and Megatron's parallel state). Each case is a model section of a trainer
config; the layers are built exactly as the trainer builds them on CPU (megatron_trainer.model:
the local spec with our SDPA attention), run forward once in fp32 on one rank, and every tensor
saved for backward is counted once per storage, parameters and the rotary table excluded.
Prints {case: bytes per token per layer}.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

import torch


def measure(model: dict[str, Any], platform: Any) -> float:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.transformer_block import TransformerBlock

    from megatron_contract.config import parse_config
    from megatron_trainer import model as trainer_model

    from .trainer_configs import GPT_TINY

    doc = copy.deepcopy(GPT_TINY)
    doc["model"].update(model)
    cfg = parse_config(doc)
    config = trainer_model.transformer_config(cfg, platform)
    spec = trainer_model.layer_spec(cfg, config, platform, None)
    layers = TransformerBlock(config, spec, pre_process=True, post_process=False)
    layers.train()
    m = cfg.model
    tokens = m.seq_length  # micro-batch of one sequence
    hidden = torch.randn(tokens, 1, m.hidden_size, requires_grad=True)
    rotary = RotaryEmbedding(m.kv_channels, 1.0, rotary_base=int(m.rope_theta))(tokens)

    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layers(hidden, attention_mask=None, rotary_pos_emb=rotary)
    excluded = {p.untyped_storage().data_ptr() for p in layers.parameters()}
    excluded.add(rotary.untyped_storage().data_ptr())
    kept = sum(n for ptr, n in saved.items() if ptr not in excluded)
    return kept / (m.num_layers * tokens)


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", sys.argv[2] if len(sys.argv) > 2 else "29511")
    from megatron_trainer.platform import setup_platform

    platform = setup_platform("cpu", 0)  # redirects Megatron-Core's CUDA calls to the CPU
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(1)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    print(json.dumps({name: measure(model, platform) for name, model in cases.items()}))


if __name__ == "__main__":
    main()
