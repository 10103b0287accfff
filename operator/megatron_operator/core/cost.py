"""The layout cost model (pure): one optimizer step's time on one GPU, relative to the ideal.

The ideal is every FLOP of the step (the transformer layers and the output layer, split evenly
over the pipeline stages) at a fixed large-GEMM efficiency, nothing exposed. Each term adds a
share of that ideal and says why, so `mjob plan --suggest` explains its ranking
(docs/layouts.md, "The cost model", derives each term):

  - compute: GEMMs that tensor/expert-tensor parallelism makes thinner, or that get fewer rows
    (short context-parallel chunks, few tokens per expert), run below full speed;
  - recompute: full recomputation runs each layer's forward again, with its forward
    collectives; selective recomputes the attention core;
  - tensor: tensor parallelism's activation collectives, the exposed ones as Megatron-Core
    issues them (with sequence parallelism 6 of the 10 per layer; without, the forward two
    all-reduces), over NVLink;
  - context: the ring exchange of keys and values, hidden behind each step's attention where
    the attention takes longer;
  - expert: the token all-to-all, four per MoE layer, exposed (the trainer turns on neither of
    Megatron-Core's all-to-all overlaps);
  - pipeline: the bubble (pipeline - 1) / (virtualPipeline × microbatches), the last stage's
    extra work (the output layer and loss), and the stage sends where they block;
  - data: the distributed optimizer's gradient reduce-scatter and parameter all-gather, once a
    step, beyond the backward/forward pass that hides them; Megatron FSDP's gathers and
    reduce-scatters, every microbatch, beyond that microbatch's compute;
  - memory: a layout our estimate puts above 92% of the GPU's memory (a risk, not a time).
Communication that is hidden still costs HIDDEN_COST of its time (its kernels take SMs and
memory bandwidth). It ranks layouts; it does not predict a step time, and no GPU measurement
went into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_contract.config import ModelConfig, TrainingConfig
from megatron_operator.core.memory import ParallelDegrees, stage_layers


@dataclass(frozen=True)
class Hardware:
    """What the cost model assumes about a GPU node (H100 SXM, NVLink, NDR InfiniBand)."""

    peak_flops: float = 989e12  # dense bf16
    gemm_efficiency: float = 0.55  # of peak, for large GEMMs
    nvlink_bytes_per_s: float = 360e9  # bus bandwidth of a collective inside a node
    network_bytes_per_s: float = 45e9  # per GPU between nodes (400 Gb/s)


H100 = Hardware()
HIDDEN_COST = 0.1  # share of a hidden transfer's time that still slows the compute
GEMM_HALVING_COST = 0.04  # throughput lost per halving of a GEMM below full size
GEMM_FULL_ROWS = 4096  # rows (tokens) from which a GEMM runs at full efficiency
TIGHT_MEMORY = 0.92  # above this share of gpuMemoryGiB a layout is marked (and costs) "tight"
TIGHT_COST = 0.02
ACTIVATION_BYTES = 2  # bf16 activations, gradients sent between stages
GRAD_BYTES = 4  # fp32 gradients (grad_reduce_in_fp32), reduce-scattered in fp32


@dataclass(frozen=True)
class Term:
    name: str
    share: float  # of the ideal step time
    why: str


@dataclass(frozen=True)
class Cost:
    relative_step_time: float  # 1.0: every FLOP at the reference efficiency, nothing exposed
    terms: tuple[Term, ...]

    def why(self) -> str:
        shown = [t for t in self.terms if t.share >= 0.005 or t.name == "compute"]
        return "; ".join(f"{t.name} {t.share:.0%} ({t.why})" for t in shown)


def _attention_params(m: ModelConfig) -> float:
    h = m.hidden_size
    if m.mla is not None:
        a = m.mla
        heads = m.num_attention_heads
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q = (a.q_lora_rank * (h + heads * qk)) if a.q_lora_rank else h * heads * qk
        kv = h * (a.kv_lora_rank + a.qk_pos_emb_head_dim)
        kv += a.kv_lora_rank * heads * (a.qk_head_dim + a.v_head_dim)
        return float(q + kv + heads * a.v_head_dim * h)
    q = m.kv_channels * m.num_attention_heads
    kv = m.kv_channels * m.num_query_groups
    return float(h * (q + 2 * kv) + q * h)


def _mlp_params(m: ModelConfig, ffn: int) -> float:
    return float(m.hidden_size * ffn * (3 if m.activation == "swiglu" else 2))


def _head_dims(m: ModelConfig) -> tuple[int, int, int]:
    """(query/key head dim, value head dim, key/value heads)."""
    if m.mla is not None:
        a = m.mla
        return a.qk_head_dim + a.qk_pos_emb_head_dim, a.v_head_dim, m.num_attention_heads
    return m.kv_channels, m.kv_channels, m.num_query_groups


def _penalty(*dims: float) -> float:
    """Throughput a GEMM loses below full size: GEMM_HALVING_COST per halving of its smallest
    dimension (rows, inner or output width on this GPU) below GEMM_FULL_ROWS."""
    return GEMM_HALVING_COST * max(0.0, math.log2(GEMM_FULL_ROWS / max(1.0, min(dims))))


def _gemms(m: ModelConfig, tp: int, rows: float) -> list[tuple[float, float]]:
    """(FLOPs per row, penalty) of the attention projections on this GPU."""
    h = m.hidden_size
    heads = m.num_attention_heads
    if m.mla is not None:
        a = m.mla
        qk, latent = heads * (a.qk_head_dim + a.qk_pos_emb_head_dim), a.kv_lora_rank
        shapes: list[tuple[float, float]] = []
        if a.q_lora_rank:
            shapes += [(h, a.q_lora_rank), (a.q_lora_rank, qk / tp)]
        else:
            shapes += [(h, qk / tp)]
        shapes += [
            (h, latent + a.qk_pos_emb_head_dim),  # the KV down-projection, on every TP rank
            (latent, heads * (a.qk_head_dim + a.v_head_dim) / tp),
            (heads * a.v_head_dim / tp, h),
        ]
    else:
        q, kv = heads * m.kv_channels, m.num_query_groups * m.kv_channels
        shapes = [(h, (q + 2 * kv) / tp), (q / tp, h)]
    return [(6 * k * n, _penalty(rows, k, n)) for k, n in shapes]


def _mlp_gemms(m: ModelConfig, ffn: float, split: float, rows: float) -> list[tuple[float, float]]:
    h, g = m.hidden_size, 2 if m.activation == "swiglu" else 1
    return [
        (6 * h * g * ffn / split, _penalty(rows, h, g * ffn / split)),
        (6 * ffn / split * h, _penalty(rows, ffn / split, h)),
    ]


@dataclass(frozen=True)
class _Layer:
    """One layer's FLOPs on this GPU for one microbatch (forward + backward), by kind."""

    gemm: float  # attention projections, dense MLP or shared experts, router
    core: float  # attention scores and weighted values (causal)
    experts: float
    gemm_penalty: float
    core_penalty: float
    expert_penalty: float

    @property
    def flops(self) -> float:
        return self.gemm + self.core + self.experts

    @property
    def slow_flops(self) -> float:
        return (
            self.gemm * self.gemm_penalty
            + self.core * self.core_penalty
            + self.experts * self.expert_penalty
        )


def step_cost(
    m: ModelConfig,
    d: ParallelDegrees,
    t: TrainingConfig,
    gpus_per_node: int,
    tight: bool = False,
    hw: Hardware = H100,
) -> Cost:
    """One step's time on one GPU relative to the ideal, as explained terms (module docstring)."""
    w = ACTIVATION_BYTES if t.precision != "fp32" else 4
    h, s, tp = m.hidden_size, m.seq_length, d.tp
    sp = tp if d.sequence_parallel else 1
    tokens = t.micro_batch_size * s / d.cp  # rows of this GPU's GEMMs for one microbatch
    micro = t.num_microbatches
    speed = hw.peak_flops * hw.gemm_efficiency
    d_qk, d_v, kv_heads = _head_dims(m)
    heads = m.num_attention_heads

    # FLOPs per layer and microbatch on this GPU; forward + backward = 3 × forward.
    def flops(gemms: list[tuple[float, float]], rows: float) -> tuple[float, float]:
        total = sum(f for f, _ in gemms) * rows
        return total, (sum(f * p for f, p in gemms) * rows / total if total else 0.0)

    core = 3 * tokens * s * heads * (d_qk + d_v) / tp  # causal: half of the s × s products
    dense_gemm, dense_pen = flops(
        _gemms(m, tp, tokens) + _mlp_gemms(m, m.ffn_hidden_size, tp, tokens), tokens
    )
    dense = _Layer(dense_gemm, core, 0.0, dense_pen, _penalty(tokens), 0.0)
    moe_layer = dense
    rows_per_expert = 0.0
    if m.moe is not None:
        e = m.moe
        # Routed rows on this GPU: its tokens (1/TP with sequence parallelism) × top-k, spread
        # over its num_experts / EP experts, all-gathered over expert-tensor ranks.
        rows_per_expert = e.router_top_k * tokens * d.etp * d.ep / (sp * e.num_experts)
        shared = _mlp_gemms(m, e.shared_expert_ffn_hidden_size or 0, tp, tokens)
        moe_gemm, moe_pen = flops(_gemms(m, tp, tokens) + shared, tokens)
        moe_gemm += 6 * tokens * h * e.num_experts / sp  # the router
        routed, routed_pen = flops(_mlp_gemms(m, e.ffn_hidden_size, d.etp, rows_per_expert), 1.0)
        routed *= e.router_top_k * tokens * d.etp / sp  # rows on this GPU
        moe_layer = _Layer(moe_gemm, core, routed, moe_pen, _penalty(tokens), routed_pen)
    output = 6 * tokens * h * m.padded_vocab_size / tp  # the last stage's output layer

    # Per pipeline rank; the ideal is the mean.
    def rank_flops(rank: int) -> tuple[float, float]:
        n_dense, n_moe = stage_layers(m, d, rank)
        flops = n_dense * dense.flops + n_moe * moe_layer.flops
        slow = n_dense * dense.slow_flops + n_moe * moe_layer.slow_flops
        if rank == d.pp - 1:
            out_pen = _penalty(tokens, h, m.padded_vocab_size / tp)
            flops, slow = flops + output, slow + output * out_pen
        return flops, slow

    per_rank = [rank_flops(r) for r in range(d.pp)]
    mean_flops = sum(f for f, _ in per_rank) / d.pp
    ideal = micro * mean_flops / speed  # seconds
    n_moe_total = m.num_layers - (min(m.moe.first_k_dense_layers, m.num_layers) if m.moe else 0)
    stage_moe = (n_moe_total if m.moe else 0) / d.pp  # mean MoE layers per rank
    stage_dense = m.num_layers / d.pp - stage_moe

    def share(seconds: float) -> float:
        return seconds / ideal

    def link(span: int) -> tuple[float, str]:
        if span <= gpus_per_node:
            return hw.nvlink_bytes_per_s, "NVLink"
        return hw.network_bytes_per_s, "the network"

    terms: list[Term] = []
    slow = sum(s_ for _, s_ in per_rank) / d.pp
    why = []
    if tokens < GEMM_FULL_ROWS:
        why.append(f"{tokens:.0f} tokens a GEMM")
    if m.moe is not None and rows_per_expert < GEMM_FULL_ROWS:
        why.append(f"{rows_per_expert:.0f} rows per expert")
    if dense.gemm_penalty > 0 and tokens >= GEMM_FULL_ROWS:
        why.append(f"weights below {GEMM_FULL_ROWS} wide{f' (TP{tp})' if tp > 1 else ''}")
    terms.append(Term("compute", slow / mean_flops, ", ".join(why) or "full-size GEMMs"))

    # Tensor parallelism, per layer and microbatch. A unit is one all-gather or reduce-scatter
    # of the layer's activations, (TP-1)/TP of T·h·2 bytes per GPU. Megatron-Core (and TE
    # without userbuffers) exposes, per block, with sequence parallelism: the forward
    # all-gather and reduce-scatter and the backward all-gather of the output gradient (3),
    # and hides the backward reduce-scatter of the input gradient behind the weight-gradient
    # GEMM and the re-gather of the input behind the data-gradient GEMM (2); without sequence
    # parallelism: the forward all-reduce (2 units) exposed, the backward one (2) hidden.
    tensor_exposed = tensor_hidden = tensor_fwd = 0.0
    if tp > 1:
        unit = (tp - 1) / tp * tokens * h * w / hw.nvlink_bytes_per_s
        n_exposed, n_hidden, n_fwd = (3, 2, 2) if d.sequence_parallel else (2, 2, 2)
        blocks = 2 * stage_dense  # attention + MLP of each dense layer
        if m.moe is not None:
            shared_block = 1 if m.moe.shared_expert_ffn_hidden_size else 0
            blocks += stage_moe * (1 + shared_block)
        tensor_exposed = blocks * n_exposed * unit
        tensor_hidden = blocks * n_hidden * unit
        tensor_fwd = blocks * n_fwd * unit
    if m.moe is not None and d.etp > 1:
        # The routed tokens are all-gathered over expert-tensor ranks before the experts and
        # reduce-scattered after, forward and backward.
        unit = (d.etp - 1) / d.etp * m.moe.router_top_k * tokens * d.etp / sp * h * w
        tensor_exposed += stage_moe * 4 * unit / hw.nvlink_bytes_per_s
        tensor_fwd += stage_moe * 2 * unit / hw.nvlink_bytes_per_s
    if tensor_exposed:
        terms.append(
            Term(
                "tensor",
                share(micro * (tensor_exposed + HIDDEN_COST * tensor_hidden)),
                f"TP{tp} activation collectives inside a node, "
                f"{'6' if d.sequence_parallel else '4'} of "
                f"{'10' if d.sequence_parallel else '8'} per layer exposed",
            )
        )

    # Context parallelism: the ring passes this rank's keys and values CP-1 times forward, and
    # keys, values and their gradients CP-1 times backward, each step hidden behind that
    # step's share of the attention.
    context_fwd = 0.0
    if d.cp > 1:
        bw, where = link(tp * d.cp)
        kv_bytes = tokens * (d_qk + d_v) * max(1.0, kv_heads / tp) * w
        fwd_step, fwd_compute = kv_bytes / bw, core / 3 / d.cp / speed
        bwd_step, bwd_compute = 2 * kv_bytes / bw, 2 * core / 3 / d.cp / speed
        exposed = max(0.0, fwd_step - fwd_compute) + max(0.0, bwd_step - bwd_compute)
        hidden = min(fwd_step, fwd_compute) + min(bwd_step, bwd_compute)
        per_layer = (d.cp - 1) * (exposed + HIDDEN_COST * hidden)
        context_fwd = (d.cp - 1) * max(0.0, fwd_step - fwd_compute)
        layers = m.num_layers / d.pp
        hid = "hidden behind attention" if exposed == 0 else "partly exposed"
        terms.append(
            Term(
                "context",
                share(micro * layers * per_layer),
                f"CP{d.cp} ring over {where}, {hid}",
            )
        )

    # Expert parallelism: dispatch and combine, forward and backward, each moving this rank's
    # routed rows ((EP-1)/EP of them leave it). Peers inside the node go over NVLink, the rest
    # over the network at the same time.
    expert_one = 0.0
    if m.moe is not None and d.ep > 1:
        rows_bytes = m.moe.router_top_k * tokens / sp * h * w
        local = min(d.ep, max(1, gpus_per_node // d.etp))
        inside = (local - 1) / d.ep * rows_bytes / hw.nvlink_bytes_per_s
        outside = (d.ep - local) / d.ep * rows_bytes / hw.network_bytes_per_s
        expert_one = max(inside, outside)
        where = "NVLink" if local == d.ep else "NVLink and the network"
        terms.append(
            Term(
                "expert",
                share(micro * stage_moe * 4 * expert_one),
                f"EP{d.ep} all-to-all over {where}, 4 per MoE layer, not overlapped",
            )
        )

    fsdp_seconds = 0.0
    # The weights whose gradients a data-parallel group reduces, on the rank holding the most
    # (the first stage's embedding, or both vocabulary matrices without pipelining).
    dense_params = stage_dense * (_attention_params(m) + _mlp_params(m, m.ffn_hidden_size))
    expert_params = 0.0
    if m.moe is not None:
        e = m.moe
        shared_mlp = _mlp_params(m, e.shared_expert_ffn_hidden_size or 0)
        dense_params += stage_moe * (_attention_params(m) + shared_mlp)
        expert_params = stage_moe * e.num_experts * _mlp_params(m, e.ffn_hidden_size)
    vocab_matrices = 2 if m.untie_embeddings_and_output_weights and d.pp == 1 else 1
    dense_params += vocab_matrices * h * m.padded_vocab_size
    dense_params /= tp
    expert_params /= d.ep * d.etp
    param_bytes = w
    dense_ranks, expert_ranks = d.dp * d.cp, d.edp
    dense_bw, dense_where = link(tp * d.cp * d.dp)
    expert_bw, _ = link(d.etp * d.ep * d.edp)

    def moved(bytes_per_param: float) -> float:
        """Seconds to move this GPU's share of bytes_per_param over its data-parallel groups."""
        out = 0.0
        if dense_ranks > 1:
            out += (dense_ranks - 1) / dense_ranks * dense_params * bytes_per_param / dense_bw
        if expert_ranks > 1 and expert_params:
            out += (expert_ranks - 1) / expert_ranks * expert_params * bytes_per_param / expert_bw
        return out

    microbatch_compute = mean_flops / speed
    if d.fsdp:
        # Megatron FSDP (optim_grads_params) all-gathers each layer's weights before its
        # forward and again before its backward, and reduce-scatters its gradients, in every
        # microbatch (megatron_fsdp.py reduces on every backward when gradients are sharded);
        # the next layer's gather overlaps this layer's compute.
        per_micro = moved(2 * param_bytes + GRAD_BYTES)
        first_gather = moved(param_bytes) / max(1.0, m.num_layers / d.pp)
        exposed = max(0.0, per_micro - microbatch_compute) + first_gather
        hidden = per_micro - max(0.0, per_micro - microbatch_compute)
        fsdp_seconds = micro * (exposed + HIDDEN_COST * hidden)
        terms.append(
            Term(
                "data",
                share(fsdp_seconds),
                f"FSDP{d.dp}: weights gathered twice and gradients reduce-scattered in each of "
                f"{micro} microbatches over {dense_where}",
            )
        )
    elif dense_ranks > 1 or expert_ranks > 1:
        # The distributed optimizer: once a step, the fp32 gradients are reduce-scattered as
        # the last microbatch's backward produces them, and the updated 16-bit weights
        # all-gathered as the next step's first forward needs them (overlap_grad_reduce,
        # overlap_param_gather); what takes longer than that pass is exposed.
        rs, ag = moved(GRAD_BYTES), moved(param_bytes)
        exposed = max(0.0, rs - 2 * microbatch_compute / 3) + max(0.0, ag - microbatch_compute / 3)
        seconds = exposed + HIDDEN_COST * (rs + ag - exposed)
        if seconds / ideal >= 0.0005:
            terms.append(
                Term(
                    "data",
                    share(seconds),
                    f"gradient reduce-scatter + weight all-gather once a step over "
                    f"{dense_where} (DP{d.dp})",
                )
            )

    if t.recompute != "none":
        layers_flops = stage_dense * dense.flops + stage_moe * moe_layer.flops
        layers_slow = stage_dense * dense.slow_flops + stage_moe * moe_layer.slow_flops
        if t.recompute == "full":
            again = (layers_flops + layers_slow) / 3 / speed
            again += tensor_fwd + stage_moe * 2 * expert_one + m.num_layers / d.pp * context_fwd
            why_r = "each layer's forward runs again, with its forward collectives"
        else:
            again = (stage_dense + stage_moe) * core / 3 / speed
            why_r = "the attention core's forward runs again"
        terms.append(Term("recompute", share(micro * again), why_r))

    if d.pp > 1:
        vpp = d.vpp or 1
        bubble = (d.pp - 1) / (vpp * micro)
        imbalance = max(f for f, _ in per_rank) / mean_flops - 1.0
        per_micro_terms = {"compute", "recompute", "tensor", "context", "expert"}
        busy = 1.0 + sum(x.share for x in terms if x.name in per_micro_terms) + share(fsdp_seconds)
        # Neighbouring stages are TP·CP·DP ranks apart (pipeline is the outermost dimension).
        bw, _ = link(2 * tp * d.cp * d.dp)
        send = tokens / sp * h * w / bw
        # Each rank sends each microbatch's activations forward and gradients backward, once per
        # model chunk. The interleaved schedule overlaps them (overlap_p2p_comm); 1F1B's
        # batched send-and-receive waits.
        sends = 2 * vpp * micro * send
        sends_cost = sends * (HIDDEN_COST if vpp > 1 else 1.0)
        why_p = f"bubble (PP{d.pp}-1)/(VPP{vpp}·{micro} microbatches) = {bubble:.1%}"
        if imbalance >= 0.005:
            why_p += f", last stage +{imbalance:.0%} (output layer)"
        terms.append(Term("pipeline", (bubble + imbalance) * busy + share(sends_cost), why_p))

    if tight:
        terms.append(Term("memory", TIGHT_COST, "estimate above 92% of gpuMemoryGiB"))
    return Cost(1.0 + sum(x.share for x in terms), tuple(terms))
