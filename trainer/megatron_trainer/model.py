"""GPT models (Llama-style dense, Mixtral/DeepSeek-style MoE, optional MLA) from the resolved config."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from megatron_contract.config import TrainerConfig
from megatron_contract.errors import ConfigError

from .attention import SDPAttention
from .decisions import (
    attention_choice,
    ddp_options,
    derive_p2p_flags,
    fused_ops,
    gradient_accumulation_fusion,
)
from .platform import Platform
from .validate import te_problems

log = logging.getLogger(__name__)

_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}


def use_transformer_engine(platform: Platform) -> bool:
    if not platform.is_cuda:
        return False
    from .platform.cuda import transformer_engine_available

    return transformer_engine_available()


def apex_available(platform: Platform) -> bool:
    if not platform.is_cuda:
        return False
    from .platform.cuda import apex_grad_accum_available

    return apex_grad_accum_available()


def transformer_config(cfg: TrainerConfig, platform: Platform) -> TransformerConfig:
    """Map the resolved config onto Megatron-Core's TransformerConfig (or MLATransformerConfig).

    Megatron-Core's own checks (ValueError/AssertionError in __post_init__) become a ConfigError,
    so a model it rejects exits 78 (fail the job) instead of 1 (a counted restart).
    """
    kwargs = transformer_config_kwargs(cfg, platform)
    try:
        if cfg.model.mla is not None:
            return MLATransformerConfig(**kwargs)
        return TransformerConfig(**kwargs)
    except (ValueError, AssertionError) as err:
        raise ConfigError(
            [f"model: Megatron-Core {_MCORE} rejects this model configuration: {err}"]
        ) from err


_MCORE = "0.16.1"


def transformer_config_kwargs(cfg: TrainerConfig, platform: Platform) -> dict[str, Any]:
    """The keyword arguments of the TransformerConfig, derived from the config and platform."""
    m, p, t = cfg.model, cfg.parallelism, cfg.training
    te = use_transformer_engine(platform)
    # The launcher refused these already if TE is not installed (validate.py); here a TE that is
    # installed but does not import is refused the same way.
    problems = te_problems(cfg, te)
    if problems:
        raise ConfigError(problems)
    dtype = _DTYPES[t.precision]
    activation = {"swiglu": F.silu, "gelu": F.gelu, "squared_relu": _squared_relu}[m.activation]
    kwargs: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "num_query_groups": m.num_query_groups,
        "kv_channels": m.kv_channels,
        "normalization": m.normalization,
        "layernorm_epsilon": m.norm_epsilon,
        "gated_linear_unit": m.activation == "swiglu",
        "activation_func": activation,
        "add_bias_linear": m.add_bias_linear,
        "attention_dropout": m.attention_dropout,
        "hidden_dropout": m.hidden_dropout,
        "init_method_std": 0.02,
        "tensor_model_parallel_size": p.tensor,
        "pipeline_model_parallel_size": p.pipeline,
        "virtual_pipeline_model_parallel_size": p.virtual_pipeline
        if (p.virtual_pipeline or 1) > 1
        else None,
        "context_parallel_size": p.context,
        "expert_model_parallel_size": p.expert,
        "expert_tensor_parallel_size": p.expert_tensor,
        "sequence_parallel": p.sequence_parallel,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "bf16": t.precision in ("bf16", "fp8"),
        "fp16": t.precision == "fp16",
        # Per-token loss: gradients are divided by the global token count, so DP/PP layouts
        # and uneven loss masks give the same update as one big batch.
        "calculate_per_token_loss": True,
        # Free pipeline outputs early (Megatron-LM's default) to save activation memory.
        "deallocate_pipeline_outputs": True,
        # CPU init draws each weight from the CPU RNG and slices this rank's shard, so the
        # weights do not depend on the TP layout (and, with per-layer seeds, on PP). On GPU that
        # would be slow for big models, so weights are initialised on the device.
        "use_cpu_initialization": not platform.is_cuda,
        "gradient_accumulation_fusion": gradient_accumulation_fusion(
            te, apex_available(platform), p.fsdp
        ),
    }
    # Fusions: only those Megatron-Core accepts for this activation/bias, and only on CUDA.
    kwargs.update(
        fused_ops(m.activation, m.add_bias_linear, platform.is_cuda, te, m.mla is not None)
    )
    # Never batch two sends to the same peer (PP=2 with interleaving): see derive_p2p_flags.
    flags = derive_p2p_flags(p.pipeline, p.virtual_pipeline, platform.is_cuda)
    kwargs.update(overlap_p2p_comm=flags.overlap_p2p_comm, batch_p2p_comm=flags.batch_p2p_comm)
    if t.recompute == "selective":
        kwargs["recompute_granularity"] = "selective"
    elif t.recompute == "full":
        kwargs.update(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    if t.precision == "fp8":
        kwargs.update(fp8="hybrid", fp8_recipe="delayed")
    if m.moe is not None:
        moe = m.moe
        kwargs.update(
            num_moe_experts=moe.num_experts,
            moe_router_topk=moe.router_top_k,
            moe_ffn_hidden_size=moe.ffn_hidden_size,
            moe_shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size,
            moe_layer_freq=[0] * moe.first_k_dense_layers
            + [1] * (m.num_layers - moe.first_k_dense_layers),
            moe_aux_loss_coeff=moe.aux_loss_coeff,
            moe_router_load_balancing_type="aux_loss" if moe.aux_loss_coeff > 0 else "none",
            moe_token_dispatcher_type=moe.token_dispatcher,
            # Grouped GEMM needs TE; otherwise experts run one after another (SequentialMLP).
            moe_grouped_gemm=te,
            moe_router_dtype="fp32",
            moe_router_pre_softmax=moe.router_pre_softmax,
        )
    if m.mla is not None:
        mla = m.mla
        kwargs.update(
            q_lora_rank=mla.q_lora_rank,
            kv_lora_rank=mla.kv_lora_rank,
            qk_head_dim=mla.qk_head_dim,
            qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim,
            v_head_dim=mla.v_head_dim,
            rope_type="rope",
            rotary_base=m.rope_theta,
        )
    return kwargs


def _squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(F.relu(x), 2)


def _with_sdpa(layer_spec: ModuleSpec) -> ModuleSpec:
    """Swap the local spec's unfused DotProductAttention for SDPAttention."""
    spec = copy.deepcopy(layer_spec)
    spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def _seeded_layer_class(base: type, seed: int) -> type:
    """A TransformerLayer that reseeds the CPU RNG from its global layer number before init.

    With CPU initialisation every weight comes from the CPU RNG in construction order, so the
    layers a pipeline stage builds would otherwise depend on how many layers earlier stages
    built. Seeding per global layer makes PP=2 start from exactly the PP=1 weights.
    """

    class SeededLayer(base):  # type: ignore[misc]
        def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
            layer_number = kwargs.get("layer_number", args[1] if len(args) > 1 else 1)
            vp_stage = kwargs.get("vp_stage")
            pp_rank = parallel_state.get_pipeline_model_parallel_rank()
            global_layer = layer_number + get_transformer_layer_offset(config, vp_stage, pp_rank)
            torch.manual_seed(layer_seed(seed, global_layer))
            super().__init__(config, *args, **kwargs)

    SeededLayer.__name__ = SeededLayer.__qualname__ = base.__name__
    return SeededLayer


def layer_seed(seed: int, global_layer: int) -> int:
    """Seed for layer `global_layer` (1-based); 0 is the embedding."""
    return (seed * 1_000_003 + global_layer * 7919) % (2**63)


def _define_missing_te_gemm() -> None:
    """Megatron-Core 0.16.1 without TE: the MoE router tests `te_general_gemm is not None`, but
    moe_utils only defines that name when TE imports, so every MoE forward raises NameError.
    Defining it as None selects the router's plain-torch path, as intended."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _mla_without_te() -> None:
    """Megatron-Core 0.16.1 without TE: megatron.core.extensions.transformer_engine imports with
    a MagicMock in place of TE, so multi_latent_attention's `HAVE_TE` is True and its
    `isinstance(self.linear_proj, TELinear)` raises TypeError (TELinear is a mock instance) when
    every MLA layer is built. Its HAVE_TE only guards that TE-only fp8/fp4 branch; setting it to
    what is true (no TE) lets MLA build with the local spec."""
    from megatron.core.transformer import multi_latent_attention

    multi_latent_attention.HAVE_TE = False


def layer_spec(
    cfg: TrainerConfig, config: TransformerConfig, platform: Platform, vp_stage: int | None
) -> Any:
    te = use_transformer_engine(platform)
    if cfg.model.mla is not None and not te:
        _mla_without_te()
    if cfg.model.moe is not None:
        if not te:
            _define_missing_te_gemm()
        block = get_gpt_decoder_block_spec(
            config, use_transformer_engine=te, normalization=cfg.model.normalization,
            vp_stage=vp_stage,
        )  # fmt: skip
        if not te:
            block.layer_specs = [_with_sdpa(s) for s in block.layer_specs]
        if not platform.is_cuda:
            for s in block.layer_specs:
                s.module = _seeded_layer_class(s.module, cfg.training.seed)
        return block
    if te:
        return get_gpt_layer_with_transformer_engine_spec(
            multi_latent_attention=cfg.model.mla is not None
        )
    spec = _with_sdpa(
        get_gpt_layer_local_spec(
            normalization=cfg.model.normalization, multi_latent_attention=cfg.model.mla is not None
        )
    )
    if not platform.is_cuda:
        spec.module = _seeded_layer_class(spec.module, cfg.training.seed)
    return spec


def fsdp_options(fsdp: bool) -> dict[str, Any]:
    """DistributedDataParallelConfig fields for parallelism.fsdp, as Megatron-LM sets them for
    --use-megatron-fsdp with --data-parallel-sharding-strategy optim_grads_params (its
    arguments.py): weights, gradients and optimizer state all sharded over DP × CP."""
    if not fsdp:
        return {}
    return {
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
    }


def build_model(
    cfg: TrainerConfig,
    platform: Platform,
    config: TransformerConfig,
    buckets: tuple[bool, int | None],
    before_wrap: Callable[[list[Any]], None] | None = None,
) -> list[Any]:
    """Model chunks (one per virtual pipeline stage), wrapped for bf16 and in Megatron DDP (or
    Megatron FSDP). `buckets`: (overlap_grad_reduce, bucket size in parameters; None: one bucket
    per chunk), see decisions.ddp_bucket_size and ddp_buckets. `before_wrap` gets the bare
    GPTModel chunks, on their device, before any wrapper (to load weights into them)."""
    spec, why = attention_choice(
        use_transformer_engine(platform),
        platform.is_cuda,
        cfg.model.mla is not None,
        cfg.model.moe is not None,
    )
    if torch.distributed.get_rank() == 0:
        log.info("model: %s, because %s", spec, why)
    vpp = config.virtual_pipeline_model_parallel_size
    chunks = []
    for stage in range(vpp or 1):
        vp_stage = stage if vpp else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        if not platform.is_cuda:
            torch.manual_seed(layer_seed(cfg.training.seed, 0))
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(cfg, config, platform, vp_stage),
            vocab_size=cfg.model.padded_vocab_size,
            max_sequence_length=cfg.model.max_position_embeddings,
            pre_process=pre,
            post_process=post,
            share_embeddings_and_output_weights=not cfg.model.untie_embeddings_and_output_weights,
            position_embedding_type=cfg.model.position_embedding,
            rotary_base=int(cfg.model.rope_theta),
            # Llama 3.1's scaling; its other three values are Megatron-Core's fixed ones, which
            # the layout rules require (megatron_contract.rules.LLAMA3_FIXED).
            rope_scaling=cfg.model.rope_scaling is not None,
            rope_scaling_factor=cfg.model.rope_scaling.factor if cfg.model.rope_scaling else 8.0,
            vp_stage=vp_stage,
        )
        for param in model.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunks.append(model)
    if platform.is_cuda:
        chunks = [m.cuda(torch.cuda.current_device()) for m in chunks]
    if before_wrap is not None:
        before_wrap(chunks)
    if config.bf16 or config.fp16:
        chunks = [Float16Module(config, m) for m in chunks]
    overlap_grad_reduce, bucket_size = buckets
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        use_distributed_optimizer=True,
        bucket_size=bucket_size,
        **{
            **ddp_options(platform.is_cuda, cfg.training.precision, config.overlap_p2p_comm),
            "overlap_grad_reduce": overlap_grad_reduce,
            **fsdp_options(cfg.parallelism.fsdp),
        },
    )
    wrapper: Any = DistributedDataParallel
    if cfg.parallelism.fsdp:
        # Megatron FSDP (Megatron-LM's --use-megatron-fsdp): one unit a transformer layer.
        from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

        wrapper = FullyShardedDataParallel
    # Bucketing only for the first chunk, as Megatron-LM: the others' communication overlaps
    # compute anyway (and the optimizer state layout must match its checkpoints).
    wrapped = [
        wrapper(config, ddp_config, module=m, disable_bucketing=i > 0) for i, m in enumerate(chunks)
    ]
    return wrapped
