"""Per-GPU memory estimate (pure): weights, optimizer state, activations, overhead.

It counts what Megatron-LM's `megatron/training/theoretical_memory_usage.py` (core_v0.16.1)
counts, term by term, for what our trainer runs: mixed precision with fp32 gradient
accumulation, Megatron-Core's distributed optimizer sharded over data × context ranks, fused
(flash) attention, a fused cross-entropy, no dropout unless the model sets it. docs/layouts.md
("The memory estimate") lists each term against Megatron-LM's and says where and why they
differ. It is an estimate meant to reject layouts that cannot fit, not to predict the allocator
to the byte; no GPU measurement went into it.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_contract.config import ModelConfig, ParallelismConfig

GIB = 1024**3

# What the step needs besides tensors the model owns (docs/layouts.md, "Overhead"):
# - the CUDA context with cuBLAS/cuDNN/Transformer Engine workspaces;
CUDA_CONTEXT_GIB = 1.0
# - NCCL's buffers for the ring and tree collectives the step uses (data, tensor, context and
#   pipeline groups): about 1.6 GB for one all-reduce communicator on 8 GPUs (NVIDIA/nccl#864);
NCCL_GIB = 1.5
# - and, with expert parallelism, the all-to-all, which connects every pair of the group on all
#   channels: 1.06 GB before and 4.34 GB after the first all_to_all_single on 8 H100s
#   (NVIDIA/nccl#1685).
NCCL_ALL_TO_ALL_GIB = 3.0


@dataclass(frozen=True)
class ParallelDegrees:
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    dp: int
    edp: int
    sequence_parallel: bool
    fsdp: bool = False

    def config(self) -> ParallelismConfig:
        """The degrees under the contract's names (the plan's JSON and the trainer config)."""
        return ParallelismConfig(
            tensor=self.tp,
            pipeline=self.pp,
            virtual_pipeline=self.vpp,
            context=self.cp,
            expert=self.ep,
            expert_tensor=self.etp,
            data=self.dp,
            expert_data=self.edp,
            sequence_parallel=self.sequence_parallel,
            fsdp=self.fsdp,
        )


@dataclass(frozen=True)
class MemoryEstimate:
    """GiB per GPU on the most loaded pipeline stage (the first or the last)."""

    parameters_total: int
    parameters_per_gpu: int
    weights_and_optimizer_gib: float
    activations_gib: float
    overhead_gib: float
    # Megatron FSDP builds the whole (tensor-parallel) model on every rank before it shards it:
    # the GiB held at that moment, when above the training peak; 0 otherwise.
    construction_gib: float = 0.0

    @property
    def per_gpu_gib(self) -> float:
        training = self.weights_and_optimizer_gib + self.activations_gib
        return max(training, self.construction_gib) + self.overhead_gib


def _gated(m: ModelConfig) -> bool:
    return m.activation == "swiglu"


def _attention_params(m: ModelConfig) -> int:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        heads = m.num_attention_heads
        q = (a.q_lora_rank * (h + heads * qk + 1)) if a.q_lora_rank else h * heads * qk
        kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + a.kv_lora_rank * (
            heads * (a.qk_head_dim + a.v_head_dim) + 1
        )
        return q + kv + heads * a.v_head_dim * h
    q = m.kv_channels * m.num_attention_heads
    kv = m.kv_channels * m.num_query_groups
    return h * (q + 2 * kv) + q * h


def _mlp_params(m: ModelConfig, ffn: int) -> int:
    return m.hidden_size * ffn * (3 if _gated(m) else 2)


def _norm_params(m: ModelConfig) -> int:
    return m.hidden_size * (1 if m.normalization == "RMSNorm" else 2)


def parameter_counts(m: ModelConfig, padded_vocab: int) -> tuple[int, int, int, int]:
    """(dense params per dense layer, dense params per MoE layer, expert params per MoE layer,
    embedding params), each counted once (unsharded)."""
    attn = _attention_params(m) + 2 * _norm_params(m)
    dense_layer = attn + _mlp_params(m, m.ffn_hidden_size)
    if m.moe is None:
        return dense_layer, dense_layer, 0, m.hidden_size * padded_vocab
    shared = _mlp_params(m, m.moe.shared_expert_ffn_hidden_size or 0)
    router = m.hidden_size * m.moe.num_experts
    moe_dense = attn + shared + router
    experts = m.moe.num_experts * _mlp_params(m, m.moe.ffn_hidden_size)
    return dense_layer, moe_dense, experts, m.hidden_size * padded_vocab


def _dense_layers(m: ModelConfig) -> int:
    return min(m.moe.first_k_dense_layers, m.num_layers) if m.moe else m.num_layers


def stage_layers(m: ModelConfig, d: ParallelDegrees, rank: int) -> tuple[int, int]:
    """(dense layers, MoE layers) that pipeline rank `rank` holds. Layers are split evenly
    (the contract requires it); with virtual stages rank r holds chunks r, r + PP, r + 2·PP, …
    (Megatron-Core's interleaved layout); the first `first_k_dense_layers` are dense."""
    chunks = d.vpp or 1
    per_chunk = m.num_layers // (d.pp * chunks)
    k = _dense_layers(m)
    dense = 0
    for c in range(chunks):
        start = (c * d.pp + rank) * per_chunk
        dense += max(0, min(k, start + per_chunk) - start)
    return dense, per_chunk * chunks - dense


def _in_flight_chunks(d: ParallelDegrees, rank: int, num_microbatches: int) -> int:
    """Model chunks whose activations pipeline rank `rank` holds at its peak: the warm-up
    forwards plus the first steady-state one, as Megatron-Core's schedules count them
    (core_v0.16.1 megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches:
    PP - rank - 1 warm-up microbatches for 1F1B; 2·(PP - rank - 1) + (VPP - 1)·PP model chunks
    interleaved), never more than the step has."""
    if d.pp == 1:
        return 1
    chunks = d.vpp or 1
    warmup = d.pp - rank - 1 if chunks == 1 else 2 * (d.pp - rank - 1) + (chunks - 1) * d.pp
    return min(num_microbatches * chunks, warmup + 1)


@dataclass(frozen=True)
class LayerBytes:
    """Bytes of activations one transformer layer keeps for its backward pass, per token of
    this rank's sequence shard (seq_length / context) and micro-batch row."""

    dense: float
    moe: float
    kept_with_full_recompute: float  # the layer's input only


def layer_bytes(m: ModelConfig, d: ParallelDegrees, width: int = 2) -> LayerBytes:
    """Per-token activation bytes of one layer; `width` is the bytes of an activation (2 for
    bf16/fp16, 4 for fp32). docs/layouts.md lists each tensor.

    Korthikanti et al.'s 34 (Megatron-LM's `18 + 4·ffn/h`) counted tensor by tensor: each block
    keeps its norm input and the norm output (the first linear layer's input), split over
    tensor ranks only with sequence parallelism; attention keeps Q, K, V and its output (flash
    attention keeps no s×s scores, only an fp32 log-sum-exp per head); an MLP keeps the first
    linear layer's output and the activation's output, split over tensor ranks. Differences
    from Megatron-LM's formula: K and V are num_query_groups / num_attention_heads of Q (GQA), a
    gated MLP's first output is 2·ffn wide, and the 1-byte dropout masks exist only with
    dropout. tests/trainer/test_saved_activations.py checks these against the bytes autograd
    saves for Megatron-Core's layers."""
    h, t, w = m.hidden_size, d.tp, width
    sp = t if d.sequence_parallel else 1
    mask = h if m.hidden_dropout > 0 else 0  # the dropout before each residual add
    block = (2 * w * h + mask) / sp  # per block: norm input, norm output (and the mask)
    heads = m.num_attention_heads
    if m.mla is not None:
        a = m.mla
        qk = heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        out = heads * a.v_head_dim
        attention = w * (qk + qk + out + out) / t
        # The latent down-projections run on every tensor rank for the whole sequence shard:
        # the KV latent with its RoPE part, and its norm's output (the up-projection's input).
        latent = w * (2 * a.kv_lora_rank + a.qk_pos_emb_head_dim)
        if a.q_lora_rank:
            latent += w * 2 * a.q_lora_rank
        attention += latent
    else:
        q = heads * m.kv_channels
        kv = m.num_query_groups * m.kv_channels
        attention = w * (q + kv + kv + q) / t
    attention += 4 * heads / t  # flash attention's fp32 log-sum-exp per head
    g = 2 if _gated(m) else 1

    def mlp(ffn: int) -> float:
        return w * (g + 1) * ffn / t  # first linear's output (g·ffn wide) and the activation's

    dense = 2 * block + attention + mlp(m.ffn_hidden_size)
    if m.moe is None:
        moe = dense
    else:
        k, e = m.moe.router_top_k, m.moe
        # Each token goes to k experts. The routed rows on this rank: the tokens of its sequence
        # shard (1/TP of them with sequence parallelism) times k, all-gathered over the
        # expert-tensor group; each expert's hidden width is split over expert-tensor ranks.
        # The router's probabilities weight the activation's output (Megatron-Core's weighted
        # SwiGLU), so the combine keeps nothing of this size.
        routed = (
            w * h * k * d.etp / sp  # the experts' first linear input (the dispatched tokens)
            + w * (g + 1) * e.ffn_hidden_size * k / sp  # expert FC1 output, activation output
        )
        # The router: fp32 probabilities over all experts and the routing map (1 byte each),
        # and per chosen expert the int64 index, the fp32 probability and the permutation.
        router = (5 * e.num_experts + 24 * k) / sp
        moe = 2 * block + attention + router + routed + mlp(e.shared_expert_ffn_hidden_size or 0)
    return LayerBytes(dense, moe, kept_with_full_recompute=w * h / sp)


def estimate(
    m: ModelConfig,
    d: ParallelDegrees,
    padded_vocab: int,
    micro_batch_size: int,
    num_microbatches: int,
    precision: str,
    recompute: str,
    distributed_optimizer: bool,
    on_gpu: bool,
) -> MemoryEstimate:
    dense_layer, moe_dense, experts, embedding = parameter_counts(m, padded_vocab)
    n_dense = _dense_layers(m)
    n_moe = m.num_layers - n_dense
    outputs = 2 if m.untie_embeddings_and_output_weights else 1
    total = n_dense * dense_layer + n_moe * (moe_dense + experts) + outputs * embedding
    total += _norm_params(m)  # the final norm

    if precision == "fp32":
        weight_grad, optim, width = 8.0, 8.0, 4  # fp32 weights + grads; Adam m, v
    else:
        # 16-bit weights and fp32 gradients (the trainer's grad_reduce_in_fp32, as Megatron-LM
        # sets for bf16: arguments.py), fp32 master weights and Adam m, v.
        weight_grad, optim, width = 6.0, 12.0, 2
    if d.fsdp:
        # Megatron FSDP (optim_grads_params) shards weights, gradients and optimizer state over
        # the data-parallel × context ranks (the expert ones over expert-data).
        dense_bytes = (weight_grad + optim) / (d.dp * d.cp)
        expert_bytes = (weight_grad + optim) / d.edp
    else:
        # The distributed optimizer shards its state over the data-parallel group with context
        # parallelism (core_v0.16.1 megatron/core/optimizer/__init__.py: intra_dp_cp_group),
        # the experts' over expert-data (intra_expt_dp_group).
        dense_bytes = weight_grad + (optim / (d.dp * d.cp) if distributed_optimizer else optim)
        expert_bytes = weight_grad + (optim / d.edp if distributed_optimizer else optim)

    per_layer = layer_bytes(m, d, width)
    tokens = micro_batch_size * m.seq_length / d.cp  # of one microbatch, on this rank
    best: tuple[float, float, float, float] | None = None  # weights, acts, params, building
    for rank in sorted({0, d.pp - 1}):
        stage_dense, stage_moe = stage_layers(m, d, rank)
        first, last = rank == 0, rank == d.pp - 1
        # The first stage holds the embedding, the last the output layer (a copy of the
        # embedding when they are tied, since Megatron-Core keeps one on the last stage).
        holds_output = last and (d.pp > 1 or outputs == 2)
        vocab_params = (int(first) + int(holds_output)) * embedding
        norms = _norm_params(m) if last else 0
        params_dense = (stage_dense * dense_layer + stage_moe * moe_dense + vocab_params) / d.tp
        params_dense += norms
        params_expert = stage_moe * experts / (d.ep * d.etp)
        weights = params_dense * dense_bytes + params_expert * expert_bytes
        construction = 0.0
        if d.fsdp:
            # The layer being computed and the next one being gathered, with their unsharded
            # gradients before the reduce-scatter.
            layer = max(dense_layer, moe_dense) / d.tp + experts / (d.ep * d.etp)
            weights += 2 * layer * weight_grad
            # The embedding and output layer are in no FSDP unit (units are transformer
            # layers): the root's parameters stay gathered from the forward to the end of the
            # backward, with their unsharded gradients.
            weights += (vocab_params / d.tp + norms) * weight_grad
            # The model is built whole (no meta-device init) and then sharded: for a moment
            # every parameter of this rank's tensor slice exists unsharded, beside the sharded
            # weight and gradient buffers Megatron FSDP allocates for it.
            unsharded = params_dense + params_expert
            construction = unsharded * (width + weight_grad / (d.dp * d.cp))

        layers = stage_dense + stage_moe
        chunks = _in_flight_chunks(d, rank, num_microbatches)
        in_flight_layers = chunks * layers / (d.vpp or 1)
        if recompute == "full":
            # Only each layer's input is kept; one layer is rematerialised at a time.
            dense_peak = per_layer.dense if stage_dense else 0.0
            biggest = max(dense_peak, per_layer.moe if stage_moe else 0.0)
            per_token = in_flight_layers * per_layer.kept_with_full_recompute + biggest
        else:
            # Selective recomputation of the attention core saves nothing here: with flash
            # attention its only activations are Q, K, V and the output, which the layers
            # around it keep anyway.
            mix = (stage_dense * per_layer.dense + stage_moe * per_layer.moe) / max(1, layers)
            per_token = in_flight_layers * mix
        microbatches = chunks / (d.vpp or 1)
        per_token += 8 * microbatches  # token ids (int64) of each microbatch in flight
        if first and m.hidden_dropout > 0:
            per_token += m.hidden_size * microbatches  # the embedding's dropout mask
        if last:
            sp = d.tp if d.sequence_parallel else 1
            # The final norm's input and output, then at the loss one microbatch's logits and
            # the fused cross-entropy's fp32 softmax (core_v0.16.1 fusions/fused_cross_entropy.py
            # saves `exp_logits` after `.float()`; with fp32 logits that is the same tensor).
            logit_bytes = 6.0 if precision != "fp32" else 4.0
            per_token += 2 * width * m.hidden_size / sp + logit_bytes * padded_vocab / d.tp
        acts = per_token * tokens
        stage = (weights, acts, params_dense + params_expert, construction)
        if best is None or max(weights + acts, construction) > max(best[0] + best[1], best[3]):
            best = stage
    assert best is not None
    overhead = 0.0
    if on_gpu:
        overhead = CUDA_CONTEXT_GIB + NCCL_GIB + (NCCL_ALL_TO_ALL_GIB if d.ep > 1 else 0.0)
    return MemoryEstimate(
        parameters_total=int(total),
        parameters_per_gpu=int(best[2]),
        weights_and_optimizer_gib=best[0] / GIB,
        activations_gib=best[1] / GIB,
        overhead_gib=overhead,
        construction_gib=best[3] / GIB if best[3] > best[0] + best[1] else 0.0,
    )


# The in-memory checkpoint tiers (megatron_contract/tiers.py), in host memory, per pod.
# A snapshot holds a rank's weights and its distributed-optimizer shard: the fp32 main weights
# and Adam's two moments (12 bytes a parameter, over the data-parallel × context ranks).
SNAPSHOT_OPTIMIZER_BYTES = 12
# Each file's non-tensor part (the sharded state dict's metadata, the common state): measured
# at ~0.2 MiB for the tiny model; a generous bound.
SNAPSHOT_METADATA_BYTES = 16 * 1024**2


def snapshot_bytes(params_per_rank: int, precision: str, dp_cp: int, dedup_weights: bool) -> int:
    """Bytes of one rank's snapshot. `dedup_weights`: the replicated weights are split over
    the data-parallel ranks (Megatron-Core's fully_parallel algorithm, used on CUDA); on CPU
    every rank keeps its own copy (atomic)."""
    width = 4 if precision == "fp32" else 2
    weights = params_per_rank * width / (dp_cp if dedup_weights else 1)
    optimizer = params_per_rank * SNAPSHOT_OPTIMIZER_BYTES / dp_cp
    return int(weights + optimizer) + SNAPSHOT_METADATA_BYTES


def tier_bytes_per_pod(snapshot: int, procs_per_node: int, replica: bool, steps: int) -> int:
    """Host memory a pod's tiers hold at most: each rank's snapshot and the copy it keeps for a
    rank of the previous pod, `steps` times (the steps the volume keeps, and the one the ranks'
    buffers hold)."""
    return snapshot * procs_per_node * (2 if replica else 1) * steps
