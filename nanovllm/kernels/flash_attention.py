"""The flash-attn backend, for users who have the flash-attn package installed (never required).

flash-attn reads the same paged layout ([num_blocks, block_size, kv_heads,
head_dim], block size a multiple of 256), which the rotary kernel writes; it
reads no FP8 cache (the config refuses that pair, so the scales are always None),
and is given no sliding window or soft-cap (the config refuses models that need
them with this backend, so `window` and `softcap` are always None).
"""

import torch
from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache

from nanovllm.kernels.triton_attention import TritonAttentionBackend
from nanovllm.utils.context import Context


class FlashAttentionBackend(TritonAttentionBackend):
    """Prefill through flash_attn_varlen_func, decode through flash_attn_with_kvcache."""

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        k_scale: None = None,
        v_scale: None = None,
        *,
        window: None = None,
        softcap: None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert window is None and softcap is None, "Config refuses windows and soft-caps with flash_attn"
        _refuse_sinks(sinks)
        if context.block_tables is not None:  # a cached prefix: read every key through the block tables
            k, v = k_cache, v_cache
        return flash_attn_varlen_func(
            q,
            k,
            v,
            context.cu_seqlens_q,
            context.cu_seqlens_k,
            context.max_seqlen_q,
            context.max_seqlen_k,
            softmax_scale=scale,
            causal=True,
            block_table=context.block_tables,
        )

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        k_scale: None = None,
        v_scale: None = None,
        *,
        window: None = None,
        softcap: None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert window is None and softcap is None, "Config refuses windows and soft-caps with flash_attn"
        _refuse_sinks(sinks)
        # q: [seqs, heads, d] -> flash-attn's [seqs, 1, heads, d]
        o = flash_attn_with_kvcache(
            q.unsqueeze(1),
            k_cache,
            v_cache,
            cache_seqlens=context.context_lens,
            block_table=context.query_block_tables(),
            softmax_scale=scale,
            causal=True,
        )
        return o.squeeze(1)


def _refuse_sinks(sinks: torch.Tensor | None) -> None:
    """ValueError for a layer with attention sinks, which flash_attn's kernels do not take."""
    if sinks is not None:
        raise ValueError("attention_backend 'flash_attn' has no attention sinks; use attention_backend='triton'")
