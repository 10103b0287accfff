"""check_hf_config: our resolved spec.model against a Hugging Face config.json, written by
transformers itself (5.x spelling) or by hand in the 4.x spelling. Pure: no process group."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.config import parse_config
from megatron_trainer.hf import check_hf_config

from .trainer_configs import GPT_TINY

pytestmark = pytest.mark.trainer


def our_model(**changes: Any) -> Any:
    """gpt-tiny's model (a Llama: RMSNorm, SwiGLU, RoPE, GQA, untied) with `changes`."""
    data = copy.deepcopy(GPT_TINY)
    data["model"].update(changes)
    return parse_config(data).model


def gpt_tiny_as_hf(directory: Path, **changes: Any) -> Path:
    """config.json of the Hugging Face twin of gpt-tiny, saved by transformers."""
    transformers = pytest.importorskip("transformers")
    fields: dict[str, Any] = dict(
        vocab_size=1024, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
        rope_theta=10000.0, max_position_embeddings=128, tie_word_embeddings=False,
        hidden_act="silu",
    )  # fmt: skip
    fields.update(changes)
    transformers.LlamaConfig(**fields).save_pretrained(directory)
    return directory


def test_matching_config_has_no_problems(tmp_path: Path) -> None:
    assert check_hf_config(our_model(), gpt_tiny_as_hf(tmp_path)) == []


def test_transformers_4_spelling(tmp_path: Path) -> None:
    # 4.x writes rope_theta at the top level and may omit head_dim (hidden / heads = 32 here).
    config = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1024,
        "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "rope_scaling": None, "max_position_embeddings": 128,
        "tie_word_embeddings": False, "hidden_act": "silu",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert check_hf_config(our_model(ropeTheta=500000.0), tmp_path) == []
    assert check_hf_config(our_model(), tmp_path) == [
        f"spec.model.ropeTheta is 10000.0 but {tmp_path}/config.json has rope_theta 500000.0: "
        "set spec.model.ropeTheta to 500000.0"
    ]


def test_every_mismatch_names_our_field_and_their_value(tmp_path: Path) -> None:
    hf_dir = gpt_tiny_as_hf(
        tmp_path, hidden_size=256, head_dim=64, num_key_value_heads=4, intermediate_size=512,
        num_hidden_layers=2, vocab_size=32000, rms_norm_eps=1e-6, rope_theta=500000.0,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    problems = check_hf_config(our_model(), hf_dir)
    expected = {
        "hiddenSize": "hidden_size 256",
        "kvChannels": "head_dim 64",
        "numQueryGroups": "num_key_value_heads 4",
        "ffnHiddenSize": "intermediate_size 512",
        "numLayers": "num_hidden_layers 2",
        "vocabSize": "vocab_size 32000",
        "normEpsilon": "rms_norm_eps 1e-06",
        "ropeTheta": "rope_theta 500000.0",
        "maxPositionEmbeddings": "max_position_embeddings 4096",
        "untieEmbeddingsAndOutputWeights": "tie_word_embeddings (negated) False",
    }
    assert len(problems) == len(expected), problems
    for field, theirs in expected.items():
        assert any(p.startswith(f"spec.model.{field} is ") and theirs in p for p in problems), (
            field,
            problems,
        )


def test_architectures_we_cannot_import(tmp_path: Path) -> None:
    scaled = gpt_tiny_as_hf(
        tmp_path / "llama3",
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
    )  # fmt: skip
    # Llama 3.1's scaling is imported when the spec says so (test_hf_interchange.py); without
    # spec.model.ropeScaling the problem says what to set.
    assert any("set spec.model.ropeScaling to {type: llama3, factor: 8, lowFreqFactor: 1, "
               "highFreqFactor: 4, originalMaxPositionEmbeddings: 64}" in p
               for p in check_hf_config(our_model(), scaled))  # fmt: skip
    yarn = gpt_tiny_as_hf(
        tmp_path / "yarn",
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096},
    )  # fmt: skip
    assert any("RoPE scaling 'yarn' is not supported (llama3 is)" in p for p in check_hf_config(
        our_model(), yarn))  # fmt: skip
    biased = gpt_tiny_as_hf(tmp_path / "bias", attention_bias=True)
    assert any("attention_bias true" in p for p in check_hf_config(our_model(), biased))
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text(json.dumps({"model_type": "qwen2_moe"}))
    [problem] = check_hf_config(our_model(), tmp_path / "qwen")
    assert "model_type 'qwen2_moe' is not supported" in problem
    gelu = check_hf_config(
        our_model(activation="gelu", normalization="LayerNorm"), tmp_path / "bias"
    )
    assert any(p.startswith("spec.model.activation is 'gelu'") for p in gelu)
    assert any(p.startswith("spec.model.normalization is 'LayerNorm'") for p in gelu)


def test_missing_or_broken_config_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    [missing] = check_hf_config(our_model(), tmp_path / "nowhere")
    assert "config.json: cannot read the Hugging Face config" in missing
    (tmp_path / "config.json").write_text("{not json")
    [broken] = check_hf_config(our_model(), tmp_path)
    assert "config.json: not valid JSON" in broken
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    [incomplete] = check_hf_config(our_model(), tmp_path)
    assert "missing or malformed field" in incomplete


def test_the_check_does_not_import_torch() -> None:
    # The launcher validates before any rank imports torch (seconds); the check must stay pure.
    code = "import sys, megatron_trainer.hf; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
