"""Core attention through `torch.nn.functional.scaled_dot_product_attention`.

Megatron-Core's local `DotProductAttention` materialises the s×s score matrix. SDPA picks a fused
kernel instead (flash / memory-efficient on GPU, a fused CPU kernel on CPU), so this is what the
local spec uses when Transformer Engine is absent. It follows the `CoreAttention` call protocol:
inputs are [seq, batch, heads, head_dim], the output is [seq, batch, heads·value_head_dim].
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class SDPAttention(MegatronModule):  # type: ignore[misc]
    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism; use TE")
        self.attn_mask_type = attn_mask_type
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        # MLA passes its own scale and its head dims: a query/key dim (k_channels, the no-RoPE
        # plus the RoPE part) that differs from the value dim (v_channels). SDPA takes a value
        # head dim different from the query/key dim, and the output has the value dim.
        self.k_channels = k_channels or config.kv_channels
        self.v_channels = v_channels or config.kv_channels
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(self.k_channels)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise NotImplementedError("SDPAttention supports neither attention bias nor packing")
        seq_q, batch = query.size(0), query.size(1)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if k.size(1) != q.size(1):  # GQA: share each key/value head across its query heads
            repeat = q.size(1) // k.size(1)
            k = k.repeat_interleave(repeat, dim=1)
            v = v.repeat_interleave(repeat, dim=1)
        mask_type = attn_mask_type or self.attn_mask_type
        mask = None
        causal = False
        if attention_mask is not None:
            mask = ~attention_mask  # Megatron masks are True where attention is forbidden
        else:
            causal = mask_type == AttnMaskType.causal
        dropout = self.dropout_p if self.training else 0.0
        if dropout > 0.0 and not self.config.sequence_parallel:
            # Heads are split across TP ranks, so dropout must use the TP-rank-specific RNG.
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                    scale=self.softmax_scale,
                )  # fmt: skip
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                scale=self.softmax_scale,
            )  # fmt: skip
        # [b, n, s, d] -> [s, b, n·d]
        return out.permute(2, 0, 1, 3).reshape(seq_q, batch, -1)
