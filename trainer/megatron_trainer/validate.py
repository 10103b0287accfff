"""Cross-field validation of a parsed TrainerConfig against the env and the platform.

Pure Python, run by the launcher before any rank starts, so an impossible job exits 78 in
milliseconds instead of failing deep inside Megatron-Core after minutes of start-up. The rules are
Megatron-Core 0.16.1's (see shared/notes/megatron-core.md, "Layout validity rules").
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import ConfigError, RuntimeEnv, TrainerConfig


def validate(
    config: TrainerConfig, env: RuntimeEnv | None = None, *, check_paths: bool = True
) -> None:
    """Raise ConfigError listing every problem; return None when the job can run.

    `check_paths=False` skips the checks that data and tokenizer files exist (for checking a
    rendered config away from the pod's volumes, e.g. in the contract test).
    """
    problems: list[str] = []
    _check_env(config, env, problems)
    _check_layout(config, problems)
    _check_model(config, problems)
    _check_training(config, problems)
    _check_platform(config, problems)
    _check_data(config, problems, check_paths)
    _check_profiling(config, problems)
    if problems:
        raise ConfigError(problems)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _check_env(config: TrainerConfig, env: RuntimeEnv | None, problems: list[str]) -> None:
    res = config.resources
    if env is None:
        return
    if env.nnodes != res.nodes:
        problems.append(f"NNODES ({env.nnodes}) differs from resources.nodes ({res.nodes})")
    if env.nproc_per_node != res.procs_per_node:
        problems.append(
            f"NPROC_PER_NODE ({env.nproc_per_node}) differs from resources.procsPerNode "
            f"({res.procs_per_node})"
        )
    if env.world_size != config.world_size:
        problems.append(
            f"WORLD_SIZE ({env.world_size}) differs from resources.nodes × procsPerNode "
            f"({config.world_size})"
        )


def _check_layout(config: TrainerConfig, problems: list[str]) -> None:
    p, m, world = config.parallelism, config.model, config.world_size
    tp, pp, cp, ep = p.tensor, p.pipeline, p.context, p.expert
    model_parallel = tp * pp * cp
    if world % model_parallel:
        problems.append(
            f"parallelism: tensor × pipeline × context ({tp}×{pp}×{cp}={model_parallel}) must "
            f"divide the world size ({world} = resources.nodes × procsPerNode)"
        )
    elif p.data != world // model_parallel:
        problems.append(
            f"parallelism.data ({p.data}) must be world / (tensor × pipeline × context) = "
            f"{world // model_parallel}"
        )
    if config.resources.procs_per_node % tp:
        problems.append(
            f"parallelism.tensor ({tp}) must divide resources.procsPerNode "
            f"({config.resources.procs_per_node}) so tensor-parallel groups stay inside one node"
        )
    expert_parallel = p.expert_tensor * ep * pp
    if world % expert_parallel:
        problems.append(
            f"parallelism: expertTensor × expert × pipeline ({expert_parallel}) must divide the "
            f"world size ({world})"
        )
    elif p.expert_data != world // expert_parallel:
        problems.append(
            f"parallelism.expertData ({p.expert_data}) must be world / (expertTensor × expert × "
            f"pipeline) = {world // expert_parallel}"
        )
    if m.num_attention_heads % tp:
        problems.append(
            f"model.numAttentionHeads ({m.num_attention_heads}) is not divisible by "
            f"parallelism.tensor ({tp}): use one of {_divisors(m.num_attention_heads)}"
        )
    if m.num_query_groups % tp and tp % m.num_query_groups:
        problems.append(
            f"model.numQueryGroups ({m.num_query_groups}) must be a multiple or a divisor of "
            f"parallelism.tensor ({tp})"
        )
    if m.num_layers % pp:
        problems.append(
            f"model.numLayers ({m.num_layers}) is not divisible by parallelism.pipeline ({pp}): "
            f"use one of {_divisors(m.num_layers)}"
        )
    vpp = p.virtual_pipeline
    if vpp is not None and vpp > 1:
        if pp == 1:
            problems.append("parallelism.virtualPipeline needs parallelism.pipeline > 1")
        elif m.num_layers % (pp * vpp):
            problems.append(
                f"model.numLayers ({m.num_layers}) must be divisible by pipeline × virtualPipeline "
                f"({pp}×{vpp}) so every virtual stage gets whole layers"
            )
        if config.training.num_microbatches % pp:
            problems.append(
                f"training.numMicrobatches ({config.training.num_microbatches}) must be a multiple "
                f"of parallelism.pipeline ({pp}) for the interleaved (virtual) pipeline schedule"
            )
    if p.sequence_parallel and tp == 1:
        problems.append("parallelism.sequenceParallel needs parallelism.tensor > 1")
    if m.moe is not None:
        if m.moe.num_experts % ep:
            problems.append(
                f"model.moe.numExperts ({m.moe.num_experts}) is not divisible by "
                f"parallelism.expert ({ep})"
            )
        if tp > 1 and not p.sequence_parallel:
            problems.append(
                "MoE with parallelism.tensor > 1 needs parallelism.sequenceParallel: true"
            )
    elif ep > 1:
        problems.append("parallelism.expert > 1 needs an MoE model (model.moe)")
    if ep > 1 and (tp * cp * p.data) % (p.expert_tensor * ep):
        problems.append(
            f"parallelism: expertTensor × expert ({p.expert_tensor}×{ep}) must divide "
            f"tensor × context × data ({tp}×{cp}×{p.data})"
        )
    if cp > 1 and m.seq_length % (2 * cp):
        problems.append(
            f"model.seqLength ({m.seq_length}) must be divisible by 2 × parallelism.context "
            f"({2 * cp})"
        )


def _check_model(config: TrainerConfig, problems: list[str]) -> None:
    m = config.model
    if m.max_position_embeddings < m.seq_length:
        problems.append(
            f"model.maxPositionEmbeddings ({m.max_position_embeddings}) must be >= "
            f"model.seqLength ({m.seq_length})"
        )
    if m.padded_vocab_size < m.vocab_size:
        problems.append(
            f"model.paddedVocabSize ({m.padded_vocab_size}) must be >= model.vocabSize "
            f"({m.vocab_size})"
        )
    if m.padded_vocab_size % config.parallelism.tensor:
        problems.append(
            f"model.paddedVocabSize ({m.padded_vocab_size}) must be divisible by "
            f"parallelism.tensor ({config.parallelism.tensor})"
        )
    if m.num_attention_heads % m.num_query_groups:
        problems.append(
            f"model.numAttentionHeads ({m.num_attention_heads}) must be a multiple of "
            f"model.numQueryGroups ({m.num_query_groups})"
        )
    if m.moe is not None:
        if m.moe.router_top_k > m.moe.num_experts:
            problems.append(
                f"model.moe.routerTopK ({m.moe.router_top_k}) must be <= model.moe.numExperts "
                f"({m.moe.num_experts})"
            )
        if m.moe.first_k_dense_layers >= m.num_layers:
            problems.append(
                f"model.moe.firstKDenseLayers ({m.moe.first_k_dense_layers}) must be < "
                f"model.numLayers ({m.num_layers})"
            )
    if m.mla is not None and m.position_embedding != "rope":
        problems.append("model.mla needs model.positionEmbedding: rope")


def _check_training(config: TrainerConfig, problems: list[str]) -> None:
    t, dp = config.training, config.parallelism.data
    if t.global_batch_size % (t.micro_batch_size * dp):
        problems.append(
            f"training.globalBatchSize ({t.global_batch_size}) must be divisible by "
            f"microBatchSize × parallelism.data ({t.micro_batch_size}×{dp})"
        )
    elif t.num_microbatches != t.global_batch_size // (t.micro_batch_size * dp):
        problems.append(
            f"training.numMicrobatches ({t.num_microbatches}) must be globalBatchSize / "
            f"(microBatchSize × data) = {t.global_batch_size // (t.micro_batch_size * dp)}"
        )
    if t.min_lr > t.lr:
        problems.append(f"training.minLr ({t.min_lr}) must be <= training.lr ({t.lr})")
    if t.warmup_iters >= t.train_iters:
        problems.append(
            f"training.warmupIters ({t.warmup_iters}) must be < training.trainIters "
            f"({t.train_iters})"
        )


def _check_platform(config: TrainerConfig, problems: list[str]) -> None:
    if config.platform != "cpu":
        return
    p, t = config.parallelism, config.training
    why = "is CUDA-only in this trainer; use resources.accelerator: nvidia.com/gpu"
    if p.expert > 1:
        problems.append(f"parallelism.expert ({p.expert}) > 1 (expert parallelism) {why}")
    if p.context > 1:
        problems.append(f"parallelism.context ({p.context}) > 1 (context parallelism) {why}")
    if p.sequence_parallel:
        problems.append(
            "parallelism.sequenceParallel needs Transformer Engine, which the CPU platform does "
            "not have; set it to false (and use tensor parallelism 1 with MoE)"
        )
    if t.precision != "fp32":
        problems.append(
            f"training.precision {t.precision!r} needs a GPU; the CPU platform (accelerator "
            "'none') trains in fp32"
        )
    if config.model.moe is not None and config.model.moe.token_dispatcher != "allgather":
        problems.append(
            "model.moe.tokenDispatcher 'alltoall' is CUDA-only in Megatron-Core 0.16.1 (it "
            "creates CUDA streams); use 'allgather' on the CPU platform"
        )


def _check_data(config: TrainerConfig, problems: list[str], check_paths: bool) -> None:
    d = config.data
    if d.mock:
        if d.blend is not None:
            problems.append("data: mock is true but data.blend is set; choose one")
        return
    if not d.blend:
        problems.append("data.blend: required when data.mock is false (list of {weight, prefix})")
    if d.tokenizer_path is None:
        problems.append("data.tokenizer.path: required when data.mock is false")
    if not check_paths:
        return
    for i, entry in enumerate(d.blend or ()):
        for suffix in (".bin", ".idx"):
            if not os.path.isfile(entry.prefix + suffix):
                problems.append(
                    f"data.blend[{i}].prefix: {entry.prefix + suffix} does not exist; run "
                    "`mjob preprocess` to create it, or fix the prefix (without .bin/.idx)"
                )
    if d.tokenizer_path is not None and not (Path(d.tokenizer_path) / "tokenizer.json").is_file():
        problems.append(
            f"data.tokenizer.path: {d.tokenizer_path}/tokenizer.json does not exist; point it at "
            "a directory holding a Hugging Face tokenizer.json"
        )


def _check_profiling(config: TrainerConfig, problems: list[str]) -> None:
    prof = config.profiling
    if prof is None:
        return
    for rank in prof.ranks:
        if rank >= config.world_size:
            problems.append(
                f"profiling.ranks: rank {rank} does not exist (world size {config.world_size})"
            )
    if prof.start_step > config.training.train_iters:
        problems.append(
            f"profiling.startStep ({prof.start_step}) is after training.trainIters "
            f"({config.training.train_iters})"
        )
