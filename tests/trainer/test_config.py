"""The trainer's side of the contract: parsing the resolved config and the env, and validation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from megatron_contract.config import load_config, parse_config
from megatron_contract.env import FailureInjection, runtime_env
from megatron_contract.errors import ConfigError
from megatron_trainer.validate import validate

from .trainer_configs import GPT_TINY, tiny_config

pytestmark = pytest.mark.trainer

ENV = {
    "MASTER_ADDR": "tiny-0.tiny.default.svc",
    "MASTER_PORT": "29500",
    "WORLD_SIZE": "2",
    "NNODES": "1",
    "NODE_RANK": "0",
    "NPROC_PER_NODE": "2",
    "MEGATRON_CONFIG": "/etc/megatron/config.json",
}


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as err:
        validate(parse_config(data))
    return err.value.problems


def test_contract_example_parses(tmp_path: Path) -> None:
    data = tiny_config(tmp_path / "ckpt", tp=2)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    cfg = load_config(path)
    validate(cfg, runtime_env(ENV))
    assert cfg.model.hidden_size == 128
    assert cfg.model.num_query_groups == 2
    assert cfg.parallelism.tensor == 2
    assert cfg.training.num_microbatches == 4
    assert cfg.platform == "cpu"
    assert cfg.world_size == 2
    assert cfg.checkpoint.sharding_type == "dp_reshardable"
    assert cfg.model_json["hiddenSize"] == 128


def test_gpu_accelerator_selects_cuda(tmp_path: Path) -> None:
    data = tiny_config(tmp_path)
    data["resources"]["accelerator"] = "nvidia.com/gpu"
    assert parse_config(data).platform == "cuda"


def test_every_problem_is_reported_with_its_field() -> None:
    data = copy.deepcopy(GPT_TINY)
    data["model"]["hiddenSize"] = "128"
    data["training"]["lr"] = None
    del data["training"]["seed"]
    data["data"]["extra"] = 1
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    text = str(err.value)
    assert "model.hiddenSize: expected an integer, got the string '128'" in text
    assert "training.lr: expected a number, got null" in text
    assert "training.seed: required field is missing" in text
    assert "data.extra: unknown field" in text
    assert len(err.value.problems) == 4


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")


def test_unknown_recipe() -> None:
    data = copy.deepcopy(GPT_TINY)
    data["model"]["recipe"] = "gpt-huge"
    with pytest.raises(ConfigError, match=r"model\.recipe: unknown recipe 'gpt-huge'"):
        parse_config(data)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"parallelism": {"tensor": 3}}, "numAttentionHeads (4) is not divisible by"),
        ({"parallelism": {"data": 2}}, "parallelism.data: data (2) must be world"),
        ({"parallelism": {"pipeline": 3, "data": 1}}, "tensor × pipeline × context"),
        (
            {"parallelism": {"virtualPipeline": 2}},
            "virtualPipeline > 1 needs parallelism.pipeline > 1",
        ),
        ({"training": {"globalBatchSize": 7}}, "globalBatchSize (7) must be a multiple of"),
        ({"training": {"numMicrobatches": 3}}, "numMicrobatches (3) must be"),
        ({"training": {"warmupIters": 10}}, "warmupIters (10) must be below trainIters"),
        ({"model": {"maxPositionEmbeddings": 64}}, "maxPositionEmbeddings (64) is below seqLength"),
        (
            {"model": {"paddedVocabSize": 1000}},
            "padded vocabulary (1000) must be at least vocabSize",
        ),
        ({"resources": {"procsPerNode": 2}}, "parallelism.data: data (1) must be world"),
        (
            {"parallelism": {"tensor": 2}, "resources": {"nodes": 2, "procsPerNode": 1}},
            "tensor-parallel group stays inside one node",
        ),
        (
            {"parallelism": {"sequenceParallel": True}},
            "sequenceParallel needs parallelism.tensor > 1",
        ),
        (
            {
                "model": {
                    "moe": {
                        "numExperts": 4,
                        "routerTopK": 2,
                        "ffnHiddenSize": 352,
                        "sharedExpertFfnHiddenSize": None,
                        "firstKDenseLayers": 4,
                        "auxLossCoeff": 0.01,
                        "tokenDispatcher": "allgather",
                        "routerPreSoftmax": False,
                    }
                }
            },
            "firstKDenseLayers (4) must be below numLayers (4)",
        ),
    ],
)
def test_impossible_layouts(change: dict[str, dict[str, Any]], expected: str) -> None:
    data = copy.deepcopy(GPT_TINY)
    for section, fields in change.items():
        data[section].update(fields)
    assert any(expected in p for p in problems_of(data)), problems_of(data)


@pytest.mark.parametrize(
    ("section", "field", "value", "expected"),
    [
        (
            "parallelism",
            "sequenceParallel",
            True,
            "parallelism.sequenceParallel: sequence parallelism needs Transformer Engine",
        ),
        (
            "parallelism",
            "context",
            2,
            "parallelism.context: context parallelism is CUDA-only",
        ),
        ("training", "precision", "bf16", "training.precision: bf16 needs a GPU"),
    ],
)
def test_cuda_only_features_fail_on_cpu(
    section: str, field: str, value: Any, expected: str
) -> None:
    data = copy.deepcopy(GPT_TINY)
    data[section][field] = value
    assert any(expected in p for p in problems_of(data)), problems_of(data)


def test_missing_data_paths(tmp_path: Path) -> None:
    data = copy.deepcopy(GPT_TINY)
    data["data"].update(
        mock=False,
        blend=[{"weight": 1.0, "prefix": str(tmp_path / "corpus_text_document")}],
        tokenizer={"path": str(tmp_path / "tok")},
    )
    problems = problems_of(data)
    assert any(
        "data.blend[0].prefix" in p and "corpus_text_document.bin does not exist" in p
        for p in problems
    )
    assert any(
        "data.tokenizer.path" in p and "tokenizer.json does not exist" in p for p in problems
    )


def test_env_contract() -> None:
    env = runtime_env({**ENV, "NNODES": "2", "NODE_RANK": "1", "WORLD_SIZE": "4"})
    assert env.global_rank(0) == 2 and env.global_rank(1) == 3  # contiguous per node
    assert env.progress_lease is None
    assert env.config_path == "/etc/megatron/config.json"
    with pytest.raises(ConfigError) as err:
        runtime_env({"MASTER_PORT": "x", "WORLD_SIZE": "3", "NNODES": "1", "NODE_RANK": "0"})
    text = str(err.value)
    assert "MASTER_ADDR: required environment variable is not set" in text
    assert "MASTER_PORT: expected an integer, got 'x'" in text
    assert "NPROC_PER_NODE: required environment variable is not set" in text


def test_env_must_match_config(tmp_path: Path) -> None:
    cfg = parse_config(tiny_config(tmp_path, tp=2))
    with pytest.raises(ConfigError, match=r"NPROC_PER_NODE \(4\) differs"):
        validate(cfg, runtime_env({**ENV, "NPROC_PER_NODE": "4", "WORLD_SIZE": "4"}))


def test_failure_injection_syntax() -> None:
    env = runtime_env({**ENV, "MEGATRON_INJECT_FAILURE": "12, 7:1:TERM, 3:0:SIGKILL, 9:1:STOP"})
    assert env.inject_failures == (
        FailureInjection(12, 0, "KILL"),
        FailureInjection(7, 1, "TERM"),
        FailureInjection(3, 0, "KILL"),
        FailureInjection(9, 1, "STOP"),
    )
    with pytest.raises(ConfigError, match="MEGATRON_INJECT_FAILURE"):
        runtime_env({**ENV, "MEGATRON_INJECT_FAILURE": "7:1:HUP"})
