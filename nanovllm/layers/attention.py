"""Attention over the paged KV cache, through a pluggable backend."""

from typing import Protocol

import torch
from torch import nn

from nanovllm.kernels.torch_attention import TorchAttentionBackend
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.rotary_embedding import KVCacheWrite, RotaryEmbedding
from nanovllm.utils.context import Context, get_context


class AttentionBackend(Protocol):
    """What an attention implementation provides; caches are [blocks, block_size, kv_heads, d] and hold
    this step's K/V already. An FP8 cache comes with its scales, [blocks, kv_heads, block_size]."""

    supports_cuda_graphs: bool

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, context: Context, scale: float, k_scale: torch.Tensor | None = None,
                v_scale: torch.Tensor | None = None) -> torch.Tensor: ...

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: Context, scale: float,
               k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor: ...


def make_attention_backend(name: str) -> AttentionBackend:
    """The backend called `name` ('torch', 'triton' or 'flash_attn'); GPU-only ones are imported on demand."""
    if name == "triton":
        from nanovllm.kernels.triton_attention import TritonAttentionBackend
        return TritonAttentionBackend()
    if name == "flash_attn":
        from nanovllm.kernels.flash_attention import FlashAttentionBackend
        return FlashAttentionBackend()
    return TorchAttentionBackend()


class Attention(nn.Module):
    """Rotates q and k, stores this step's K/V at the slot mapping, then attends.

    The rotation and the store are one step (one kernel on CUDA), so that k is
    written to the cache once, already rotated. `k_cache`/`v_cache` are views
    into the runner's KV tensor, bound after the cache is allocated; before
    that (warm-up) nothing is stored. An FP8 cache also binds `k_scale` and
    `v_scale` (None otherwise). The runner also sets `backend` to the one the
    config chose.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, rotary: RotaryEmbedding,
                 backend: AttentionBackend | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.rotary_emb = rotary
        self.backend = backend or TorchAttentionBackend()
        self.k_cache = self.v_cache = torch.tensor([])
        self.k_scale = self.v_scale = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None) -> torch.Tensor:
        """Attention of each token's q over its sequence's keys; q_norm/k_norm (Qwen3) normalise each
        q and k head before the rotation."""
        # positions: [tokens]; q: [tokens, heads, d]; k, v: [tokens, kv_heads, d] -> [tokens, heads * d]
        context = get_context()
        scales = self.k_scale, self.v_scale
        cache = (KVCacheWrite(v, self.k_cache, self.v_cache, context.slot_mapping, *scales)
                 if self.k_cache.numel() else None)
        q, k = self.rotary_emb(positions, q, k, q_norm, k_norm, cache)
        if context.is_prefill:
            o = self.backend.prefill(q, k, v, self.k_cache, self.v_cache, context, self.scale, *scales)
        else:
            o = self.backend.decode(q, self.k_cache, self.v_cache, context, self.scale, *scales)
        return o.flatten(1)
