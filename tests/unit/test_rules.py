"""Every layout validity rule, each with a valid and an invalid case, checked three ways.

Each case runs through both implementations of the rules: the Python planner (`mjob validate`,
the operator; its layout rules are the contract's `megatron_contract.rules`) and the CRD's CEL
(what `kubectl apply` enforces). They must agree on valid vs invalid and on the field they blame.
Every valid case is also rendered and handed to the trainer (its config parser, then its
validation), so a spec the API accepts is never refused by the trainer after its pods were
scheduled.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from megatron_contract.config import parse_config
from megatron_operator.api import MegatronJobSpec, load_job
from megatron_operator.core.planner import plan, validate
from megatron_operator.core.render import config_map
from megatron_trainer.validate import validate as trainer_validate

from .celcheck import check_spec
from .specs import DELETE, job_doc, spec_of

MOE = {"numExperts": 4, "routerTopK": 2}
CPU = {"resources.accelerator": "none"}
MLA = {"kvLoraRank": 64, "qkHeadDim": 32, "qkPosEmbHeadDim": 16, "vHeadDim": 32}

# (rule, field expected to be blamed, valid changes, invalid changes[, CEL checks it too])
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    (
        "TP group inside a node",
        "spec.parallelism.tensor",
        {"resources.procsPerNode": 6, "parallelism.tensor": 2, "training.globalBatchSize": 48},
        {"resources.procsPerNode": 6, "parallelism.tensor": 4, "training.globalBatchSize": 48},
        True,
    ),
    (
        "TP·PP·CP divides the world",
        "spec.parallelism",
        {
            "resources.nodes": 4,
            "resources.procsPerNode": 2,
            "parallelism.tensor": 2,
            "parallelism.pipeline": 4,
        },
        {
            "resources.nodes": 3,
            "resources.procsPerNode": 2,
            "parallelism.tensor": 2,
            "parallelism.pipeline": 4,
        },
        True,
    ),
    (
        "explicit data size matches the world",
        "spec.parallelism.data",
        {"parallelism.data": 16},
        {"parallelism.data": 3},
        True,
    ),
    (
        "attention heads divisible by TP",
        "spec.parallelism.tensor",
        {"parallelism.tensor": 4},
        {"parallelism.tensor": 8},
        True,
    ),
    (
        "heads a multiple of query groups",
        "spec.model.numQueryGroups",
        {"model.numQueryGroups": 4},
        {"model.numQueryGroups": 3},
        True,
    ),
    (
        "query groups and TP divide one another",
        "spec.parallelism.tensor",
        {
            "model.numAttentionHeads": 12,
            "model.kvChannels": 32,
            "model.numQueryGroups": 2,
            "parallelism.tensor": 4,
        },
        {
            "model.numAttentionHeads": 12,
            "model.kvChannels": 32,
            "model.numQueryGroups": 6,
            "parallelism.tensor": 4,
        },
        True,
    ),
    (
        "FFN divisible by TP",
        "spec.parallelism.tensor",
        {"model.ffnHiddenSize": 352, "parallelism.tensor": 4},
        {"model.ffnHiddenSize": 350, "parallelism.tensor": 4},
        True,
    ),
    (
        "sequence parallel needs TP > 1",
        "spec.parallelism.sequenceParallel",
        {"parallelism.sequenceParallel": True, "parallelism.tensor": 2},
        {"parallelism.sequenceParallel": True, "parallelism.tensor": 1},
        True,
    ),
    (
        "sequence parallel splits seqLength / context over TP",
        "spec.parallelism.sequenceParallel",
        {
            "parallelism.tensor": 4,
            "parallelism.context": 2,
            "parallelism.sequenceParallel": True,
            "model.seqLength": 112,  # 56 tokens per CP rank, 14 per TP rank
        },
        {
            "parallelism.tensor": 4,
            "parallelism.context": 2,
            "parallelism.sequenceParallel": True,
            "model.seqLength": 108,  # 54 tokens per CP rank: 2·CP divides, TP does not
        },
        True,
    ),
    (
        "MoE with TP needs sequence parallel",
        "spec.parallelism.sequenceParallel",
        {"model.moe": MOE, "parallelism.tensor": 2},  # on by default with TP on GPUs
        {"model.moe": MOE, "parallelism.tensor": 2, "parallelism.sequenceParallel": False},
        True,
    ),
    (
        "sequence parallel defaults to on with TP on GPUs, off on CPU",
        "spec.parallelism.sequenceParallel",
        {**CPU, "model.moe": {**MOE, "tokenDispatcher": "allgather"}, "parallelism.tensor": 1},
        {**CPU, "parallelism.tensor": 2, "parallelism.sequenceParallel": True},
        True,
    ),
    (
        "Megatron FSDP without pipeline parallelism",
        "spec.parallelism.fsdp",
        {"parallelism.fsdp": True, "parallelism.tensor": 2, "parallelism.context": 2},
        {"parallelism.fsdp": True, "parallelism.pipeline": 2},
        True,
    ),
    (
        "Megatron FSDP combines with expert parallelism",
        "spec.parallelism.fsdp",
        {"model.moe": MOE, "parallelism.fsdp": True, "parallelism.expert": 4},
        {
            "model.moe": MOE,
            "parallelism.fsdp": True,
            "parallelism.expert": 4,
            "parallelism.pipeline": 2,
        },
        True,
    ),
    (
        "Megatron FSDP is CUDA-only",
        "spec.parallelism.fsdp",
        {"parallelism.fsdp": True},
        {**CPU, "parallelism.fsdp": True},
        True,
    ),
    (
        "nsys profiles CUDA only",
        "spec.profiling.tool",
        {**CPU, "profiling": {"tool": "viztracer", "startStep": 2, "endStep": 3}},
        {**CPU, "profiling": {"tool": "nsys", "startStep": 2, "endStep": 3}},
        True,
    ),
    (
        "one checkpoint destination: a volume or a URL",
        "spec.checkpoint",
        {
            "checkpoint.volume": DELETE,
            "checkpoint.url": "msc://s3-ckpt/jobs/a",
            "checkpoint.msc": {"configSecret": "msc-config"},
        },
        {"checkpoint.url": "msc://s3-ckpt/jobs/a", "checkpoint.msc": {"configSecret": "msc"}},
        True,
    ),
    (
        "a checkpoint URL needs the MSC config",
        "spec.checkpoint.msc.configSecret",
        {
            "checkpoint.volume": DELETE,
            "checkpoint.url": "msc://s3-ckpt/jobs/a",
            "checkpoint.msc": {"configSecret": "msc-config", "configKey": "msc.json"},
        },
        {"checkpoint.volume": DELETE, "checkpoint.url": "msc://s3-ckpt/jobs/a"},
        True,
    ),
    (
        "the MSC config only with a URL",
        "spec.checkpoint.msc",
        {"checkpoint.volume": {"claimName": "ckpt"}},
        {"checkpoint.msc": {"configSecret": "msc-config"}},
        True,
    ),
    (
        "no checkpoint.path with a URL",
        "spec.checkpoint.path",
        {
            "checkpoint.volume": DELETE,
            "checkpoint.url": "msc://s3-ckpt/jobs/a",
            "checkpoint.msc": {"configSecret": "msc-config"},
        },
        {
            "checkpoint.volume": DELETE,
            "checkpoint.url": "msc://s3-ckpt/jobs/a",
            "checkpoint.msc": {"configSecret": "msc-config"},
            "checkpoint.path": "a",
        },
        True,
    ),
    (
        "Megatron FSDP starts from weights only",
        "spec.checkpoint.init.megatron.load",
        {"parallelism.fsdp": True, "checkpoint.init": {"megatron": {"path": "/ckpt/run"}}},
        {
            "parallelism.fsdp": True,
            "checkpoint.init": {"megatron": {"path": "/ckpt/run", "load": "full"}},
        },
        True,
    ),
    (
        "Megatron FSDP checkpoints on a volume",
        "spec.checkpoint.url",
        {"parallelism.fsdp": True},
        {
            "parallelism.fsdp": True,
            "checkpoint.volume": DELETE,
            "checkpoint.url": "msc://s3-ckpt/jobs/a",
            "checkpoint.msc": {"configSecret": "msc-config"},
        },
        True,
    ),
    (
        "auto layouts leave the degrees to the operator",
        "spec.parallelism.auto",
        {"parallelism.auto": True, "checkpoint.shardingType": "fully_reshardable"},
        {
            "parallelism.auto": True,
            "parallelism.tensor": 2,
            "checkpoint.shardingType": "fully_reshardable",
        },
        True,
    ),
    (
        "auto layouts save reshardable checkpoints",
        "spec.checkpoint.shardingType",
        {"parallelism.auto": True, "checkpoint.shardingType": "fully_reshardable"},
        {"parallelism.auto": True},
        True,
    ),
    (
        "layers divisible by PP",
        "spec.parallelism.pipeline",
        {
            "resources.nodes": 3,
            "resources.procsPerNode": 2,
            "parallelism.pipeline": 2,
            "training.globalBatchSize": 63,
        },
        {
            "resources.nodes": 3,
            "resources.procsPerNode": 2,
            "parallelism.pipeline": 3,
            "training.globalBatchSize": 64,
        },
        True,
    ),
    (
        "virtual pipeline needs PP > 1",
        "spec.parallelism.virtualPipeline",
        {"parallelism.virtualPipeline": 2, "parallelism.pipeline": 2},
        {"parallelism.virtualPipeline": 2},
        True,
    ),
    (
        "layers split into PP × VPP stages",
        "spec.parallelism.virtualPipeline",
        {"model.numLayers": 8, "parallelism.pipeline": 2, "parallelism.virtualPipeline": 2},
        {"model.numLayers": 8, "parallelism.pipeline": 2, "parallelism.virtualPipeline": 3},
        True,
    ),
    (
        "interleaved schedule: microbatches a multiple of PP",
        "spec.training.globalBatchSize",
        {
            "model.numLayers": 8,
            "parallelism.pipeline": 2,
            "parallelism.virtualPipeline": 2,
            "training.globalBatchSize": 32,
        },
        {
            "model.numLayers": 8,
            "parallelism.pipeline": 2,
            "parallelism.virtualPipeline": 2,
            "training.globalBatchSize": 24,
        },
        True,
    ),
    (
        "EP needs an MoE model",
        "spec.parallelism.expert",
        {"model.moe": MOE, "parallelism.expert": 2},
        {"parallelism.expert": 2},
        True,
    ),
    (
        "experts divisible by EP",
        "spec.parallelism.expert",
        {"model.moe": {"numExperts": 6, "routerTopK": 2}, "parallelism.expert": 2},
        {"model.moe": {"numExperts": 6, "routerTopK": 2}, "parallelism.expert": 4},
        True,
    ),
    (
        "router top-k at most the experts",
        "spec.model.moe.routerTopK",
        {"model.moe": {"numExperts": 4, "routerTopK": 4}},
        {"model.moe": {"numExperts": 4, "routerTopK": 5}},
        True,
    ),
    (
        "expert FFN divisible by ETP",
        "spec.parallelism.expertTensor",
        {"model.moe": {**MOE, "ffnHiddenSize": 92}, "parallelism.expertTensor": 4},
        {"model.moe": {**MOE, "ffnHiddenSize": 90}, "parallelism.expertTensor": 4},
        True,
    ),
    (
        "at least one MoE layer after the dense ones",
        "spec.model.moe.firstKDenseLayers",
        {"model.moe": {**MOE, "firstKDenseLayers": 3}},
        {"model.moe": {**MOE, "firstKDenseLayers": 4}},  # gpt-tiny has 4 layers
        True,
    ),
    (
        "ETP · EP · PP divides the world",
        "spec.parallelism.expert",
        {
            "model.moe": {"numExperts": 8, "routerTopK": 2},
            "parallelism.expert": 8,
            "parallelism.expertTensor": 2,
        },
        {
            "model.moe": {"numExperts": 8, "routerTopK": 2},
            "parallelism.expert": 8,
            "parallelism.expertTensor": 4,
        },
        True,
    ),
    (
        "sequence length divisible by 2·CP",
        "spec.parallelism.context",
        {
            "resources.nodes": 3,
            "resources.procsPerNode": 2,
            "parallelism.context": 3,
            "model.seqLength": 126,
        },
        {
            "resources.nodes": 3,
            "resources.procsPerNode": 2,
            "parallelism.context": 3,
            "model.seqLength": 128,
        },
        True,
    ),
    (
        "hidden divisible by heads unless kvChannels",
        "spec.model.hiddenSize",
        {"model.numAttentionHeads": 3, "model.numQueryGroups": 3, "model.kvChannels": 40},
        {"model.numAttentionHeads": 3, "model.numQueryGroups": 3},
        True,
    ),
    (
        "max positions cover the sequence",
        "spec.model.maxPositionEmbeddings",
        {"model.maxPositionEmbeddings": 128},
        {"model.maxPositionEmbeddings": 64},
        True,
    ),
    (
        "context parallelism is CUDA-only",
        "spec.parallelism.context",
        {"parallelism.context": 2},
        {**CPU, "parallelism.context": 2},
        True,
    ),
    (
        "CPU trains in fp32",
        "spec.training.precision",
        {**CPU, "training.precision": "fp32"},
        {**CPU, "training.precision": "bf16"},
        True,
    ),
    (
        "sequence parallelism is CUDA-only",
        "spec.parallelism.sequenceParallel",
        {"parallelism.tensor": 2, "parallelism.sequenceParallel": True},
        {**CPU, "parallelism.tensor": 2, "parallelism.sequenceParallel": True},
        True,
    ),
    (
        "the alltoall MoE dispatcher is CUDA-only",
        "spec.model.moe.tokenDispatcher",
        {**CPU, "model.moe": {**MOE, "tokenDispatcher": "allgather"}},
        {**CPU, "model.moe": MOE},
        True,
    ),
    (
        "multi-latent attention needs rope",
        "spec.model.positionEmbedding",
        {"model.mla": MLA},
        {"model.mla": MLA, "model.positionEmbedding": "learned_absolute"},
        True,
    ),
    (
        "global batch a multiple of micro batch × DP",
        "spec.training.globalBatchSize",
        {"training.globalBatchSize": 64, "training.microBatchSize": 2},
        {"training.globalBatchSize": 60, "training.microBatchSize": 2},
        True,
    ),
    (
        "minLr at most lr",
        "spec.training.minLr",
        {"training.minLr": 0.0001},
        {"training.minLr": 0.1},
        True,
    ),
    (
        "warmup ends before the run does",
        "spec.training.warmupIters",
        {"training.warmupIters": 99},
        {"training.warmupIters": 100},  # == trainIters: Megatron-Core needs warmup < decay
        True,
    ),
    (
        "profiling window in order",
        "spec.profiling.endStep",
        {"profiling": {"startStep": 2, "endStep": 3}},
        {"profiling": {"startStep": 4, "endStep": 3}},
        True,
    ),
    (
        "profiling starts within the run",
        "spec.profiling.startStep",
        {"profiling": {"startStep": 100, "endStep": 100}},
        {"profiling": {"startStep": 101, "endStep": 102}},
        True,
    ),
    (
        "profiled ranks exist",
        "spec.profiling.ranks",
        {"profiling": {"startStep": 2, "endStep": 3, "ranks": [0, 15]}},
        {"profiling": {"startStep": 2, "endStep": 3, "ranks": [0, 16]}},
        True,
    ),
    (
        "mock or blend, not both",
        "spec.data",
        {"data": {"blend": [{"weight": 1.0, "prefix": "/d/a"}], "tokenizer": {"path": "/t"}}},
        {
            "data": {
                "mock": True,
                "blend": [{"weight": 1.0, "prefix": "/d/a"}],
                "tokenizer": {"path": "/t"},
            }
        },
        True,
    ),
    ("some data", "spec.data", {"data": {"mock": True}}, {"data": {}}, True),
    (
        "blend needs a tokenizer",
        "spec.data.tokenizer",
        {"data": {"blend": [{"weight": 1.0, "prefix": "/d/a"}], "tokenizer": {"path": "/t"}}},
        {"data": {"blend": [{"weight": 1.0, "prefix": "/d/a"}]}},
        True,
    ),
    (
        "topology mode needs a key",
        "spec.topology.key",
        {"topology": {"mode": "required", "key": "rack"}},
        {"topology": {"mode": "required"}},
        True,
    ),
    (
        "one checkpoint volume source",
        "spec.checkpoint.volume",
        {"checkpoint.volume": {"create": {"size": "1Gi"}}},
        {"checkpoint.volume": {"claimName": "a", "create": {"size": "1Gi"}}},
        True,
    ),
    (
        "a checkpoint volume source",
        "spec.checkpoint.volume",
        {"checkpoint.volume": {"claimName": "a"}},
        {"checkpoint.volume": {}},
        True,
    ),
    (
        "multi-node claims are ReadWriteMany",
        "spec.checkpoint.volume.create.accessModes",
        {"checkpoint.volume": {"create": {"size": "1Gi", "accessModes": ["ReadWriteMany"]}}},
        {"checkpoint.volume": {"create": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}}},
        True,
    ),
    (
        "one source of initial weights",
        "spec.checkpoint.init",
        {"checkpoint.init": {"huggingFace": {"path": "/models/llama"}}},
        {
            "checkpoint.init": {
                "huggingFace": {"path": "/models/llama"},
                "megatron": {"path": "/ckpt/run"},
            }
        },
        True,
    ),
    (
        "backoff cap at least the backoff",
        "spec.restartPolicy.maxBackoffSeconds",
        {"restartPolicy": {"backoffSeconds": 10, "maxBackoffSeconds": 10}},
        {"restartPolicy": {"backoffSeconds": 10, "maxBackoffSeconds": 5}},
        True,
    ),
    (
        "failure rules match something",
        "spec.restartPolicy.rules[0]",
        {"restartPolicy": {"rules": [{"action": "Fail", "exitCodes": [3]}]}},
        {"restartPolicy": {"rules": [{"action": "Fail"}]}},
        True,
    ),
    (
        "GPU request comes from procsPerNode",
        "spec.resources.requests",
        {"resources.requests": {"cpu": "8"}},
        {"resources.requests": {"cpu": "8", "nvidia.com/gpu": 8}},
        True,
    ),
    (
        "GPU limit comes from procsPerNode",
        "spec.resources.limits",
        {"resources.limits": {"memory": "1Ti"}},
        {"resources.limits": {"nvidia.com/gpu": 8}},
        True,
    ),
    (
        "requests are Kubernetes resource names",
        "spec.resources.requests",
        {
            "resources.requests": {"cpu": "8", "hugepages-2Mi": "1Gi", "rdma/ib": 1},
            # Not overcommitted: the apiserver wants their limits, equal to the requests.
            "resources.limits": {"hugepages-2Mi": "1Gi", "rdma/ib": 1},
        },
        {"resources.requests": {"cpu": "8", "mock": 1}},
        True,
    ),
    (
        "limits are Kubernetes resource names",
        "spec.resources.limits",
        {"resources.limits": {"memory": "1Ti"}},
        {"resources.limits": {"gpus": 8}},
        True,
    ),
    (
        "env does not shadow the contract",
        "spec.env[0].name",
        {"env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
        {"env": [{"name": "WORLD_SIZE", "value": "3"}]},
        True,
    ),
    (
        "model fields required without a recipe",
        "spec.model.numLayers",
        {
            "model": {
                "numLayers": 2,
                "hiddenSize": 64,
                "numAttentionHeads": 4,
                "vocabSize": 100,
                "seqLength": 32,
            }
        },
        {"model": {"hiddenSize": 64, "numAttentionHeads": 4, "vocabSize": 100, "seqLength": 32}},
        True,
    ),
    (
        "MoE overrides need expert counts on a dense recipe",
        "spec.model.moe.numExperts",
        {"model.moe": {"numExperts": 4, "routerTopK": 1}},
        {"model.moe": {"routerTopK": 1}},
        False,  # CEL treats numExperts 0 as dense; pydantic/planner report it
    ),
    (
        "per-GPU memory fits the budget",
        "spec.resources.gpuMemoryGiB",
        {
            "model.recipe": "llama3-8b",
            "parallelism.tensor": 8,
            "parallelism.sequenceParallel": True,
        },
        {"model.recipe": "llama3-8b", "resources.gpuMemoryGiB": 24},
        False,  # the memory estimate is planner-only: too rich for CEL
    ),
    (
        "yarn RoPE scaling is refused by name",
        "spec.model.ropeScaling.type",
        {"model.ropeScaling": {"type": "llama3", "factor": 8}},
        {
            "model.ropeScaling": {
                "type": "yarn",
                "factor": 40,
                "originalMaxPositionEmbeddings": 4096,
            }
        },
        True,
    ),
    (
        "llama3 RoPE scaling keeps Megatron-Core's fixed values",
        "spec.model.ropeScaling.highFreqFactor",
        {"model.ropeScaling": {"type": "llama3", "factor": 32, "highFreqFactor": 4}},
        {"model.ropeScaling": {"type": "llama3", "factor": 8, "highFreqFactor": 2}},
        True,
    ),
    (
        "llama3 RoPE scaling needs rope",
        "spec.model.ropeScaling",
        {"model.ropeScaling": {"type": "llama3", "factor": 8}},
        {
            "model.ropeScaling": {"type": "llama3", "factor": 8},
            "model.positionEmbedding": "learned_absolute",
        },
        True,
    ),
]


SPARE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any], bool]] = [
    (
        "spare nodes need the in-place strategy",
        "spec.resources.spareNodes",
        {"resources.spareNodes": 2},
        {"resources.spareNodes": 2, "restartPolicy.strategy": "Recreate"},
        True,
    ),
    (
        "a spare mounts the created checkpoint volume too",
        "spec.checkpoint.volume.create.accessModes",
        {
            "resources.nodes": 1,
            "checkpoint.volume": {"create": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}},
        },
        {
            "resources.nodes": 1,
            "resources.spareNodes": 1,
            "training.globalBatchSize": 64,
            "checkpoint.volume": {"create": {"size": "1Gi", "accessModes": ["ReadWriteOnce"]}},
        },
        True,
    ),
]
CASES += SPARE_CASES


def _python_errors(spec: dict[str, Any]) -> list[str]:
    return [e.path for e in validate(MegatronJobSpec.model_validate(spec))]


def _cel_errors(spec: dict[str, Any]) -> list[str]:
    return [v.field for v in check_spec(spec)]


def _ids() -> list[str]:
    return [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_valid_case_passes_both(
    case: tuple[str, str, dict[str, Any], dict[str, Any], bool],
) -> None:
    _, _, valid, _, cel = case
    spec = spec_of(valid)
    assert _python_errors(spec) == []
    if cel:
        assert _cel_errors(spec) == []


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_valid_case_runs_in_the_trainer(
    case: tuple[str, str, dict[str, Any], dict[str, Any], bool],
) -> None:
    """Render → the trainer's parser → the trainer's validation: what the API accepts, the
    trainer must not refuse later."""
    _, _, valid, _, _ = case
    job = load_job(job_doc(spec_of(valid)))
    cm = config_map(job, plan(job.spec))
    config = parse_config(json.loads(cm["data"]["config.json"]))
    trainer_validate(config, check_paths=False)  # raises ConfigError naming every problem


@pytest.mark.parametrize("case", CASES, ids=_ids())
def test_invalid_case_is_rejected_with_the_field(
    case: tuple[str, str, dict[str, Any], dict[str, Any], bool],
) -> None:
    _, field, _, invalid, cel = case
    spec = spec_of(invalid)
    assert _python_errors(spec) == [field]
    if cel:
        assert _cel_errors(spec) == [field]


def test_spare_nodes_are_refused_with_a_trainer_command_on_both_sides() -> None:
    command = {"trainer": {"command": ["python", "train.py"]}}
    assert _python_errors(spec_of({**command, "resources.spareNodes": 0})) == []
    assert _cel_errors(spec_of({**command, "resources.spareNodes": 0})) == []
    spec = spec_of({**command, "resources.spareNodes": 1})
    assert _python_errors(spec) == _cel_errors(spec) == ["spec.resources.spareNodes"]


def test_base_spec_is_valid() -> None:
    assert _python_errors(spec_of()) == []
    assert _cel_errors(spec_of()) == []


def test_all_errors_are_reported_at_once() -> None:
    spec = spec_of(
        {
            "parallelism.tensor": 8,
            "parallelism.sequenceParallel": False,
            "model.maxPositionEmbeddings": 64,
            "training.minLr": 1.0,
            "topology": {"mode": "preferred"},
        }
    )
    paths = _python_errors(spec)
    assert paths == sorted(
        [
            "spec.model.maxPositionEmbeddings",
            "spec.parallelism.tensor",
            "spec.topology.key",
            "spec.training.minLr",
        ]
    )
    assert sorted(_cel_errors(spec)) == paths


def test_error_message_names_fields_and_fix() -> None:
    spec = MegatronJobSpec.model_validate(
        spec_of({"model.recipe": "llama3-8b", "parallelism.tensor": 3, "resources.procsPerNode": 3})
    )
    messages = [e.message for e in validate(spec) if e.path == "spec.parallelism.tensor"]
    assert (
        "numAttentionHeads (32) is not divisible by parallelism.tensor (3): use 1, 2, 4, 8, 16 or 32"
        in messages
    )


def test_recipe_defaults_reach_cel() -> None:
    # Only the recipe says llama3-70b has 64 heads; CEL must still catch 64 % 3.
    spec = spec_of(
        {"model.recipe": "llama3-70b", "parallelism.tensor": 3, "resources.procsPerNode": 6}
    )
    assert "spec.parallelism.tensor" in _cel_errors(spec)
    spec = spec_of(
        {
            "model.recipe": "llama3-70b",
            "model.numAttentionHeads": 66,
            "parallelism.tensor": 3,
            "resources.procsPerNode": 6,
        }
    )
    cel_fields = _cel_errors(spec)
    assert "spec.parallelism.tensor" in cel_fields  # ffn 28672 % 3 still fails
    assert cel_fields.count("spec.parallelism.tensor") == 1


def test_unset_keys_are_removed_by_delete() -> None:
    spec = spec_of({"data.mock": DELETE})
    assert "mock" not in spec["data"]
