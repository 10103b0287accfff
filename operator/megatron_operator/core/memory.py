"""Per-GPU memory estimate (pure): weights, optimizer state, activations.

A port of the reasoning in Megatron-LM's `theoretical_memory_usage.py`, extended to count expert
weights under EP/ETP separately, and assuming a fused (flash) attention, which our trainer always
uses on GPU: the s² attention-score term of Korthikanti et al. is therefore absent. It is an
estimate meant to reject layouts that cannot fit, not to predict the allocator to the byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_contract.config import ModelConfig, ParallelismConfig

GIB = 1024**3
# CUDA context, NCCL buffers, allocator fragmentation: observed 3–5 GiB on H100 jobs.
GPU_OVERHEAD_GIB = 4.0


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
    """GiB per GPU on the most loaded pipeline stage (the first)."""

    parameters_total: int
    parameters_per_gpu: int
    weights_and_optimizer_gib: float
    activations_gib: float
    overhead_gib: float

    @property
    def per_gpu_gib(self) -> float:
        return self.weights_and_optimizer_gib + self.activations_gib + self.overhead_gib


def _gated(m: ModelConfig) -> bool:
    return m.activation == "swiglu"


def _attention_params(m: ModelConfig) -> int:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        heads = m.num_attention_heads
        q = (h * a.q_lora_rank + a.q_lora_rank * heads * qk) if a.q_lora_rank else h * heads * qk
        kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim) + a.kv_lora_rank * heads * (
            a.qk_head_dim + a.v_head_dim
        )
        return q + kv + heads * a.v_head_dim * h
    q = m.kv_channels * m.num_attention_heads
    kv = m.kv_channels * m.num_query_groups
    return h * (q + 2 * kv) + q * h


def _mlp_params(m: ModelConfig, ffn: int) -> int:
    return m.hidden_size * ffn * (3 if _gated(m) else 2)


def parameter_counts(m: ModelConfig, padded_vocab: int) -> tuple[int, int, int, int]:
    """(dense params per dense layer, dense params per MoE layer, expert params per MoE layer,
    embedding params), each counted once (unsharded)."""
    norms = 2 * m.hidden_size
    attn = _attention_params(m) + norms
    dense_layer = attn + _mlp_params(m, m.ffn_hidden_size)
    if m.moe is None:
        return dense_layer, dense_layer, 0, m.hidden_size * padded_vocab
    shared = _mlp_params(m, m.moe.shared_expert_ffn_hidden_size or 0)
    router = m.hidden_size * m.moe.num_experts
    moe_dense = attn + shared + router
    experts = m.moe.num_experts * _mlp_params(m, m.moe.ffn_hidden_size)
    return dense_layer, moe_dense, experts, m.hidden_size * padded_vocab


def _split_layers(m: ModelConfig, pp: int) -> tuple[int, int, int, int]:
    """(dense layers, MoE layers) in total and on the most loaded stage."""
    k = min(m.moe.first_k_dense_layers, m.num_layers) if m.moe else m.num_layers
    n_moe = m.num_layers - k
    per_stage = -(-m.num_layers // pp)
    stage_moe = min(per_stage, n_moe)
    return k, n_moe, per_stage - stage_moe, stage_moe


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
    n_dense, n_moe, stage_dense, stage_moe = _split_layers(m, d.pp)
    outputs = 2 if m.untie_embeddings_and_output_weights else 1
    total = n_dense * dense_layer + n_moe * (moe_dense + experts) + outputs * embedding

    # The first stage holds the embedding; with PP=1 it also holds the (untied) output layer.
    stage_embed = embedding * (outputs if d.pp == 1 else 1)
    dense_per_gpu = (stage_dense * dense_layer + stage_moe * moe_dense + stage_embed) / d.tp
    expert_per_gpu = stage_moe * experts / (d.ep * d.etp)

    if precision == "fp32":
        weight_grad, optim = 8.0, 8.0  # fp32 weights + grads; Adam m, v
    else:
        weight_grad, optim = 6.0, 12.0  # 16-bit weights + fp32 grads; fp32 master, m, v
    if d.fsdp:
        # Megatron FSDP (optim_grads_params) shards weights, gradients and optimizer state over
        # the data-parallel × context ranks (the expert ones over expert-data). One layer's
        # gathered weights and gradients are in flight at a time: counted below as a layer.
        dense_bytes = (weight_grad + optim) / (d.dp * d.cp)
        expert_bytes = (weight_grad + optim) / d.edp
    else:
        # Megatron-Core's distributed optimizer shards over the data-parallel group with
        # context parallelism (the trainer's DDP and optimizer use it): DP × CP ranks.
        dense_bytes = weight_grad + (optim / (d.dp * d.cp) if distributed_optimizer else optim)
        expert_bytes = weight_grad + (optim / d.edp if distributed_optimizer else optim)
    weights = dense_per_gpu * dense_bytes + expert_per_gpu * expert_bytes
    if d.fsdp:
        # The unit being computed and the next one being gathered (double buffering), whole.
        layer = max(dense_layer, moe_dense) / d.tp + experts / (d.ep * d.etp)
        weights += 2 * layer * weight_grad

    acts = _activations(m, d, padded_vocab, micro_batch_size, num_microbatches, recompute)
    if precision == "fp32":
        acts *= 2
    return MemoryEstimate(
        parameters_total=int(total),
        parameters_per_gpu=int(dense_per_gpu + expert_per_gpu),
        weights_and_optimizer_gib=weights / GIB,
        activations_gib=acts / GIB,
        overhead_gib=GPU_OVERHEAD_GIB if on_gpu else 0.0,
    )


def _activations(
    m: ModelConfig,
    d: ParallelDegrees,
    padded_vocab: int,
    mbs: int,
    num_microbatches: int,
    recompute: str,
) -> float:
    """Bytes of 16-bit activations kept on the first stage (Korthikanti et al., flash attention)."""
    s = m.seq_length / d.cp
    sbh = s * mbs * m.hidden_size
    g = 2 if _gated(m) else 1
    # Per layer: 18·sbh for attention, norms and residual masks, plus the MLP's (2g+2)·ffn/h.
    # Of the 18, 10 (norm inputs and dropout masks) split over TP only with sequence parallel.
    unsplit = 10 * sbh
    dense_split = 8 * sbh + (2 * g + 2) * s * mbs * m.ffn_hidden_size
    if m.moe is not None:
        routed = m.moe.router_top_k * m.moe.ffn_hidden_size
        shared = m.moe.shared_expert_ffn_hidden_size or 0
        moe_split = 8 * sbh + (2 * g + 2) * s * mbs * shared + 2 * sbh * m.moe.router_top_k
        moe_expert = (2 * g + 2) * s * mbs * routed / d.etp
    else:
        moe_split = moe_expert = 0.0

    def per_layer(split: float, expert: float) -> float:
        tp_div = d.tp if d.sequence_parallel else 1
        return unsplit / tp_div + split / d.tp + expert

    _, _, stage_dense, stage_moe = _split_layers(m, d.pp)
    full_dense, full_moe = per_layer(dense_split, 0.0), per_layer(moe_split, moe_expert)
    if recompute == "full":
        # Only each layer's input is kept; one layer is rematerialised at a time.
        kept = 2 * sbh / (d.tp if d.sequence_parallel else 1)
        stage = (stage_dense + stage_moe) * kept + max(full_dense, full_moe if stage_moe else 0.0)
    else:
        stage = stage_dense * full_dense + stage_moe * full_moe
    # 1F1B keeps up to PP microbatches in flight on the first stage; interleaving adds a bit.
    in_flight: float = min(d.pp, num_microbatches)
    if d.vpp:
        in_flight *= 1 + (d.pp - 1) / (d.pp * d.vpp)
    total = stage * in_flight
    total += 8 * s * mbs + 2 * sbh * in_flight  # token ids and embedding output
    if d.pp == 1:
        total += 4 * s * mbs * padded_vocab / d.tp  # fp32 logits for the loss
    return total
