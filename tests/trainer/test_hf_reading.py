"""How hf.py reads Hugging Face safetensors, in-process (no process group): a sharded directory
reads like a single file, tensor-parallel pieces reassemble into the TP=1 tensor, the fused
layouts put each Hugging Face row where Megatron expects it, and bad directories are named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_contract.config import parse_config
from megatron_contract.errors import ConfigError
from megatron_trainer.hf import INDEX_FILE, SafetensorsDir, Shard, hf_names, read_local

from .trainer_configs import GPT_TINY

pytestmark = pytest.mark.trainer
transformers = pytest.importorskip("transformers")

# Our names at layer 0 (either spec's norm names), plus the embedding, output layer and final norm.
NAMES = [
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "decoder.final_layernorm.weight",
    *(
        f"decoder.layers.0.{suffix}"
        for suffix in (
            "input_layernorm.weight",
            "self_attention.linear_qkv.layer_norm_weight",
            "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight",
            "pre_mlp_layernorm.weight",
            "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight",
        )
    ),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """The same random Llama saved as one file and in small shards, and our model config."""
    root = tmp_path_factory.mktemp("hf")
    config = transformers.LlamaConfig(
        vocab_size=250, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="60KB")
    data = copy.deepcopy(GPT_TINY)
    data["model"].update(
        numLayers=2, hiddenSize=64, ffnHiddenSize=96, numAttentionHeads=4, numQueryGroups=2,
        kvChannels=16, vocabSize=250, paddedVocabSize=256,
    )  # fmt: skip
    return root / "single", root / "sharded", parse_config(data).model


def test_sharded_directory_reads_like_one_file(saved: tuple[Path, Path, Any]) -> None:
    single_dir, sharded_dir, model = saved
    assert (sharded_dir / INDEX_FILE).is_file()
    assert len(list(sharded_dir.glob("*.safetensors"))) > 1
    with SafetensorsDir(single_dir) as single, SafetensorsDir(sharded_dir) as sharded:
        for name in NAMES:
            source = hf_names(name, 0, tied=False)
            for rank in range(2):
                shard = Shard(rank, 2)
                a = read_local(source, single, model, shard)
                assert torch.equal(a, read_local(source, sharded, model, shard)), name


def test_tensor_parallel_pieces_and_fused_layouts(saved: tuple[Path, Path, Any]) -> None:
    single_dir, _, model = saved
    whole = Shard(0, 1)
    with SafetensorsDir(single_dir) as hf:

        def ours(name: str, shard: Shard) -> torch.Tensor:
            return read_local(hf_names(name, 1, tied=False), hf, model, shard)

        prefix = "decoder.layers.0."  # global layer 1, by the argument above
        qkv = ours(prefix + "self_attention.linear_qkv.weight", whole)
        q, k, v = (hf.read(f"model.layers.1.self_attn.{p}_proj.weight") for p in "qkv")
        # Group g (2 query heads of 16 rows, then its key and value head): 64 rows.
        for g in range(2):
            block = qkv[g * 64 : (g + 1) * 64]
            assert torch.equal(block[:32], q[g * 32 : (g + 1) * 32])
            assert torch.equal(block[32:48], k[g * 16 : (g + 1) * 16])
            assert torch.equal(block[48:], v[g * 16 : (g + 1) * 16])
        # TP=2: each rank holds one whole group, in order.
        pieces = [ours(prefix + "self_attention.linear_qkv.weight", Shard(r, 2)) for r in (0, 1)]
        assert torch.equal(torch.cat(pieces), qkv)
        # SwiGLU: each rank holds [its gate rows; its up rows].
        gate = hf.read("model.layers.1.mlp.gate_proj.weight")
        up = hf.read("model.layers.1.mlp.up_proj.weight")
        fc1 = ours(prefix + "mlp.linear_fc1.weight", Shard(1, 2))
        assert torch.equal(fc1, torch.cat([gate[48:], up[48:]]))
        # Row-parallel layers split columns.
        proj = [ours(prefix + "self_attention.linear_proj.weight", Shard(r, 2)) for r in (0, 1)]
        assert torch.equal(
            torch.cat(proj, dim=1), hf.read("model.layers.1.self_attn.o_proj.weight")
        )
        # Vocabulary: 256 padded rows, 128 per rank; rank 1 ends in 6 zero rows.
        emb = ours("embedding.word_embeddings.weight", Shard(1, 2))
        assert emb.shape == (128, 64)
        assert torch.equal(emb[:122], hf.read("model.embed_tokens.weight")[128:])
        assert not emb[122:].any()


def test_bad_directories_are_named(saved: tuple[Path, Path, Any], tmp_path: Path) -> None:
    single_dir, _, model = saved
    with pytest.raises(ConfigError, match=r"neither model\.safetensors nor"):
        SafetensorsDir(tmp_path)
    with (
        SafetensorsDir(single_dir) as hf,
        pytest.raises(
            ConfigError, match=r"tensor 'model\.layers\.7\.input_layernorm\.weight' is missing"
        ),
    ):
        read_local(
            hf_names("decoder.layers.0.input_layernorm.weight", 7, False), hf, model, Shard(0, 1)
        )
    with pytest.raises(ValueError, match="has no Hugging Face Llama counterpart"):
        hf_names("decoder.layers.0.mlp.experts.linear_fc1.weight0", 0, False)
    odd = parse_config(
        {**GPT_TINY, "model": {**GPT_TINY["model"], "numQueryGroups": 1, "vocabSize": 250}}
    ).model
    with (
        SafetensorsDir(single_dir) as hf,
        pytest.raises(ConfigError, match=r"numQueryGroups \(1\) must be divisible by parallelism"),
    ):
        read_local(
            hf_names("decoder.layers.0.self_attention.linear_qkv.weight", 0, False),
            hf,
            odd,
            Shard(0, 2),
        )
