"""Pure decisions that turn the config and the platform into Megatron-Core settings.

Each function here is what would go wrong first on a GPU cluster if it were decided inline: they
take plain values (no torch, no CUDA) so tests can assert every layout class on a CPU machine.
Each cites the Megatron-LM (core_v0.16.1) code it follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_contract.env import OMP_NUM_THREADS

# CONTRACT: set by the launcher for every CUDA rank when tensor or context parallelism is used
# (Megatron-LM asserts it in arguments.py `validate_args` on Hopper and older).
CUDA_DEVICE_MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"

SHARDING_DP = "dp_reshardable"
SHARDING_FULL = "fully_reshardable"


@dataclass(frozen=True)
class P2PFlags:
    overlap_p2p_comm: bool
    batch_p2p_comm: bool


def derive_p2p_flags(pipeline: int, virtual_pipeline: int | None, is_cuda: bool) -> P2PFlags:
    """Pipeline send/recv flags.

    CUDA (NCCL), as Megatron-LM derives them (arguments.py: `overlap_p2p_comm` is on by default
    and forced off without interleaving; `batch_p2p_comm = not overlap_p2p_comm`). With
    interleaving, one exchange posts a send to the previous and one to the next stage; with PP=2
    both are the same rank, and a batched isend/irecv pairs same-peer operations in posting
    order, so activations and gradients of equal shape arrive swapped. Megatron-LM refuses
    interleaving without overlap for PP <= 2 for exactly this reason. Without interleaving every
    exchange has at most one send and one receive per peer, and batching is safe.

    CPU (gloo): neither. Measured with PP=2 and interleaving on gloo, both the batched and the
    overlapped path (several exchanges in flight between the same two ranks) pair some transfers
    wrongly (losses 1% off PP=1); the plain unbatched path, which completes each exchange before
    the next and orders sends by rank parity over two groups, is bit-identical to PP=1.
    """
    if not is_cuda:
        return P2PFlags(overlap_p2p_comm=False, batch_p2p_comm=False)
    interleaved = pipeline > 1 and (virtual_pipeline or 1) > 1
    return P2PFlags(overlap_p2p_comm=interleaved, batch_p2p_comm=not interleaved)


def fused_ops(
    activation: str, add_bias_linear: bool, is_cuda: bool, te: bool, mla: bool
) -> dict[str, bool]:
    """The kernel fusions to ask TransformerConfig for: only what Megatron-Core 0.16.1 accepts.

    TransformerConfig.__post_init__ raises ValueError for bias_activation_fusion with gelu and no
    bias (non-gated), and for any activation other than gelu/silu (squared_relu). RoPE fusion
    needs TE, and for MLA only YaRN is fused (we use plain RoPE there). On CPU nothing is fused:
    the fused paths are CUDA kernels (TE or Megatron's JIT).
    """
    bias_activation = is_cuda and (
        activation == "swiglu" or (activation == "gelu" and add_bias_linear)
    )
    return {
        "bias_activation_fusion": bias_activation,
        "bias_dropout_fusion": is_cuda,
        "masked_softmax_fusion": is_cuda,
        "apply_rope_fusion": is_cuda and te and not mla,
        "cross_entropy_loss_fusion": is_cuda,
    }


def ddp_options(is_cuda: bool, precision: str, interleaved: bool) -> dict[str, bool]:
    """DistributedDataParallelConfig fields beyond the fixed ones (model.build_model).

    - check_for_nan_in_grad: each bucket's gradient norm is checked before the data-parallel
      reduction, so a NaN/Inf fails the step (Megatron-LM's check_for_nan_in_loss_and_grad,
      on by default there). Off for fp16: its dynamic loss scaler starts at 2^32, so the first
      steps' gradients overflow by design; the scaler sees the Inf, skips the step and halves
      the scale (Megatron-LM turns the check off under dynamic loss scaling, arguments.py
      `validate_args`). A NaN loss still fails the step in the loss function.
    - overlap_grad_reduce / overlap_param_gather on CUDA: the gradient reduce-scatter overlaps
      the backward pass and the parameter all-gather of the distributed optimizer overlaps the
      next forward pass (Megatron-LM's --overlap-grad-reduce --overlap-param-gather, which its
      Hopper recipes use). Parameters are then only gathered in the next forward, so a save
      forces a sync first (Checkpointer.save, as Megatron-LM's `force_param_sync`). On CPU the
      plain path keeps gloo runs simple and bit-reproducible.
    - align_param_gather: with the interleaved schedule the pipeline schedule starts each
      chunk's parameter all-gather (`param_sync_func`), and DDP's forward hooks must not
      dispatch the next bucket themselves; Megatron-LM's default, forced off without
      interleaving (arguments.py). It is a DDP config field, read by DDP's forward pre-hook.
    """
    overlap = is_cuda
    return {
        "check_for_nan_in_grad": precision != "fp16",
        "overlap_grad_reduce": overlap,
        "overlap_param_gather": overlap,
        "align_param_gather": overlap and interleaved,
    }


# Megatron-LM's default bucket size with --overlap-grad-reduce (training.py `get_model`).
MIN_BUCKET_SIZE = 40_000_000
# What our trainer used before the bucket size was recorded in the checkpoint.
LEGACY_BUCKET_SIZE = 40_000_000


def ddp_bucket_size(overlap_grad_reduce: bool, data_parallel_with_context: int) -> int | None:
    """The DDP bucket size of a fresh run, as Megatron-LM's `get_model` derives it: one bucket
    per model chunk (None) without --overlap-grad-reduce, else max(40M, 1M·DP·CP), so NCCL's
    ring chunks stay bandwidth-bound at large DP.

    The `dp_reshardable` optimizer state is stored per bucket, so a resume must use the bucket
    size the checkpoint was saved with (`recorded_bucket_size`), not this one."""
    if not overlap_grad_reduce:
        return None
    return max(MIN_BUCKET_SIZE, 1_000_000 * data_parallel_with_context)


def recorded_bucket_size(common: dict[str, Any]) -> int | None:
    """The bucket size a checkpoint's `dp_reshardable` optimizer state was saved with, from its
    common state: ours records it (`trainer.bucketSize`); Megatron-LM's is derived from its
    `args` as its `get_model` derived it (--overlap-grad-reduce, --ddp-bucket-size, the DP and
    CP sizes). ValueError for --ddp-num-buckets, which depends on Megatron-LM's parameter count
    per rank."""
    trainer = common.get("trainer")
    if isinstance(trainer, dict):
        size = trainer.get("bucketSize", LEGACY_BUCKET_SIZE)
        return one_bucket_as_none(None if size is None else int(size))
    args = common.get("args")
    if not getattr(args, "overlap_grad_reduce", False):
        return None
    if getattr(args, "ddp_num_buckets", None) is not None:
        raise ValueError("the checkpoint was saved with --ddp-num-buckets")
    explicit = getattr(args, "ddp_bucket_size", None)
    if explicit is not None:
        return one_bucket_as_none(int(explicit))
    dp = int(getattr(args, "data_parallel_size", 1) or 1)
    cp = int(getattr(args, "context_parallel_size", 1) or 1)
    return ddp_bucket_size(True, dp * cp)


# "One bucket per model chunk" as a size: above any chunk's parameter count, so DDP never splits
# a chunk (param_and_grad_buffer.py closes a bucket only once it reaches the size), and, unlike
# None, kept when overlap_grad_reduce is on.
ONE_BUCKET = 2**62


def one_bucket_as_none(size: int | None) -> int | None:
    """A bucket size as recorded: None for one bucket per chunk, however DDP was told so."""
    return None if size is None or size >= ONE_BUCKET else size


def ddp_buckets(recorded: int | None, overlap_grad_reduce: bool) -> tuple[bool, int | None]:
    """(overlap_grad_reduce, bucket_size) for DistributedDataParallelConfig that make DDP build
    the buckets a checkpoint's optimizer state was saved in (`recorded`, None: one bucket per
    model chunk), given whether this run wants to overlap the gradient reduction.

    DDP's own rule (distributed_data_parallel.py, `__init__`) rewrites the size it is given: None
    becomes max(40M, 1M·DP) with overlap_grad_reduce, and any size becomes None (one bucket)
    without. So passing the recorded size through unchanged loses it both ways: one bucket saved
    without overlap (Megatron-LM's default) came back as 40M-parameter buckets on a GPU, and a
    recorded size came back as one bucket without overlap (CPU). One bucket with overlap is
    ONE_BUCKET; a recorded size turns overlap on."""
    if recorded is None:
        return overlap_grad_reduce, (ONE_BUCKET if overlap_grad_reduce else None)
    return True, recorded


def needs_param_broadcast(
    loads_weights: bool, data_parallel: int, expert_data_parallel: int, fsdp: bool
) -> bool:
    """Whether DP rank 0's weights must be broadcast to the other DP ranks at start.

    Every DP replica initialises identically (the same stage seed, `rank_seed`, and the same
    tracker seeds: Megatron-LM broadcasts only with --data-parallel-random-init), and a resume or
    `checkpoint.init` overwrites every weight with the same stored values on each replica. So the
    broadcast (all parameters, over DP: seconds for a large model) is only a guard for a fresh
    start, and has nothing to do with a single replica.

    Never under Megatron FSDP: its parameters are DTensor shards once wrapped, which
    `torch.distributed.broadcast` refuses (NotImplementedError: no sharding strategy for
    c10d.broadcast_), and each DP rank owns its shard alone, so there is no replica to disagree
    with (each rank shards the same full initialisation)."""
    if fsdp:
        return False
    return not loads_weights and max(data_parallel, expert_data_parallel) > 1


def gradient_accumulation_fusion(te: bool, apex: bool, fsdp: bool) -> bool:
    """Fuse the weight-gradient GEMM with the fp32 main-grad accumulation.

    TE's linear layers do this themselves, but GPTModel's output layer is Megatron's own
    ColumnParallelLinear, which raises RuntimeError at construction when the flag is on and
    Apex's `fused_weight_gradient_mlp_cuda` extension is missing (tensor_parallel/layers.py).
    So: only with TE (the local spec's layers would all need Apex) and only when Apex is there.
    Never with Megatron FSDP: its gradients live in its own sharded buffers, not in the
    `main_grad` the fused kernel accumulates into (Megatron-LM warns, and its FSDP guide runs
    --no-gradient-accumulation-fusion).
    """
    return te and apex and not fsdp


def cuda_env_defaults(
    tensor: int, context: int, cores: int, procs_per_node: int, fsdp: bool
) -> dict[str, str]:
    """Environment a CUDA rank needs before it initialises CUDA, as Megatron-LM requires it.

    - CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1: one hardware work queue, so the TP/CP
      communication kernels are scheduled before the compute they overlap (arguments.py asserts
      it on Hopper and older; Blackwell does not need it, and it does no harm there). Never with
      Megatron FSDP, whose gathers must run beside the compute on their own queues: Megatron-LM
      asserts it is not 1 there (`fsdp_problems` refuses a pod that sets it).
    - OMP_NUM_THREADS: the pod's cores shared between its ranks (torchrun, which Megatron-LM is
      started with, sets 1 for the same reason: without it every rank spins up a thread per core).
    """
    env = {OMP_NUM_THREADS: str(max(1, cores // max(1, procs_per_node)))}
    if (tensor > 1 or context > 1) and not fsdp:
        env[CUDA_DEVICE_MAX_CONNECTIONS] = "1"
    return env


def fsdp_env_problems(fsdp: bool, environ: dict[str, str]) -> list[str]:
    """The pod's environment against Megatron FSDP (Megatron-LM's arguments.py asserts this)."""
    if fsdp and environ.get(CUDA_DEVICE_MAX_CONNECTIONS) == "1":
        return [
            "env: CUDA_DEVICE_MAX_CONNECTIONS=1 serialises Megatron FSDP's parameter gathers "
            "behind the compute (Megatron-LM refuses it with FSDP): remove it from spec.env"
        ]
    return []


def rank_seed(seed: int, pipeline_rank: int) -> int:
    """The seed of one pipeline stage, as Megatron-LM's `_set_random_seed` (initialize.py):
    seed + 100·pp_rank. On GPU the weights are initialised from the device RNG (the default
    generator for replicated parameters, the model-parallel tracker for TP-sharded ones); with
    one seed for every stage, all stages would start from identical layer weights."""
    return seed + 100 * pipeline_rank


def save_sharding_type(configured: str, final: bool) -> str:
    """The distributed-optimizer layout of one save.

    `fully_reshardable` gathers every rank's optimizer state in host memory at each save (about
    850 GB per node for the 70B example), so it is used only where a TP/PP change can follow:
    the final save of a run (SIGTERM before a suspend, where the operator allows layout changes,
    or the end of training) when the spec asks for `fully_reshardable`. Periodic saves are
    `dp_reshardable`, which restarts on the same layout (crash recovery) read directly. The load
    reshards once, from whatever layout the newest checkpoint records.
    """
    return SHARDING_FULL if configured == SHARDING_FULL and final else SHARDING_DP


def attention_choice(te: bool, is_cuda: bool, mla: bool, moe: bool) -> tuple[str, str]:
    """(layer spec and attention, why), for the start-up log."""
    kind = "MLA" if mla else "GQA/MHA"
    block = "MoE decoder block" if moe else "dense layer"
    if te:
        return (
            f"Transformer Engine {block} spec, TE fused attention ({kind})",
            "transformer_engine imports on this CUDA platform",
        )
    why = (
        "the CPU platform has no Transformer Engine"
        if not is_cuda
        else "transformer_engine does not import in this image (install it for fused kernels)"
    )
    return (
        f"local {block} spec, torch scaled_dot_product_attention "
        f"({'flash/memory-efficient kernel' if is_cuda else 'CPU kernel'}, {kind})",
        why,
    )
