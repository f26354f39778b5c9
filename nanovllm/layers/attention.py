"""Attention over the paged KV cache, through a pluggable backend."""

from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from nanovllm.kernels.torch_attention import TorchAttentionBackend
from nanovllm.layers.layernorm import RMSNorm
from nanovllm.layers.rotary_embedding import RotaryEmbedding, qk_norm_weights
from nanovllm.utils.context import Context, get_context

if TYPE_CHECKING:
    from nanovllm.worker.kv_cache import LayerKVCache


class AttentionBackend(Protocol):
    """What an attention implementation provides; caches are [blocks, block_size, kv_heads, d] and hold
    this step's K/V already. `cache_scales` are the cache's own (`LayerKVCache.scales`), passed on as
    they are: None, None for a cache in the model's dtype. `window` (a query at position p sees keys
    p - window + 1 .. p), `softcap` (each score s becomes softcap * tanh(s / softcap)) and `sinks` (a logit
    per head that joins each row's softmax sum) are the layer's; None turns each off."""

    supports_cuda_graphs: bool

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
        context: Context,
        scale: float,
        *cache_scales: torch.Tensor | None,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        *cache_scales: torch.Tensor | None,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


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

    The layer's cache (`kv_cache`, a `LayerKVCache` of views into the worker's
    KV tensor, and its cache group, whose slots and block tables the layer
    reads) is handed over by `bind_kv_cache` once it is allocated; before
    that (the start-up step that sizes it) prompts attend only themselves and
    nothing is stored. On CUDA the store is fused into the rotation: one kernel
    normalises and rotates q and k and writes k, already rotated, and v to the
    cache. The runner sets `backend` to the one the config chose. `window` (the
    layer's sliding window), `softcap` (its score soft-cap) and `sinks` (its
    heads' sink logits [heads], a parameter of the model's that it loads) go to
    the backend with every call; None turns each off.

    A layer given `kv_source` (Gemma 4's last layers) keeps no cache: it rotates
    its queries only and attends over the source layer's K/V, this step's (which
    the source keeps for it, `step_kv`) and those the source stored; it gets no
    cache of its own (`owns_cache`).
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        rotary: RotaryEmbedding,
        backend: AttentionBackend | None = None,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        kv_source: "Attention | None" = None,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        # not registered here: the model holds `sinks` as its own parameter, under the checkpoint's name
        self.scoring = dict(window=window, softcap=softcap, sinks=sinks)
        self.rotary_emb = rotary
        self.backend = backend or TorchAttentionBackend()
        self.kv_cache: LayerKVCache | None = None
        # in a tuple, so that the source is not registered as a submodule a second time
        self.kv_source = () if kv_source is None else (kv_source,)
        self.keeps_step_kv = False  # whether later layers read this step's K/V (`step_kv`) of this one
        self.step_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        if kv_source is not None:
            kv_source.keeps_step_kv = True

    @property
    def owns_cache(self) -> bool:
        """Whether the layer stores K/V in a cache of its own (not one that reads another layer's)."""
        return not self.kv_source

    def bind_kv_cache(self, cache: "LayerKVCache") -> None:
        """Give this layer its slice of the KV cache."""
        assert cache.k.shape[-2:] == (self.num_kv_heads, self.head_dim)
        self.kv_cache = cache

    def _rotate_and_store(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_norm: RMSNorm | None,
        k_norm: RMSNorm | None,
        cache: "LayerKVCache",
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated (each head normalised first with q_norm/k_norm), and the rotated k and v written
        to `cache` at `slot_mapping`. On CUDA all of it is one Triton launch, the store fused into the
        rotary kernel; elsewhere the rotary layer's reference, then the cache's own store."""
        if q.is_cuda:
            from nanovllm.kernels.triton_norm_rotary_store import norm_rotate_store  # Triton is needed on CUDA only

            return norm_rotate_store(
                positions,
                q,
                k,
                self.rotary_emb.cos_sin,
                *qk_norm_weights(q_norm, k_norm),
                v,
                cache.k,
                cache.v,
                slot_mapping,
                *cache.scales,
            )
        q, k = self.rotary_emb(positions, q, k, q_norm, k_norm)
        cache.store(k, v, slot_mapping)
        return q, k

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> torch.Tensor:
        """Attention of each token's q over its sequence's keys; q_norm/k_norm (Qwen3) normalise each
        q and k head before the rotation. A layer with a `kv_source` takes no k and v."""
        # positions: [tokens]; q: [tokens, heads, d]; k, v: [tokens, kv_heads, d] -> [tokens, heads * d]
        context = get_context()
        if self.kv_source:
            source = self.kv_source[0]
            cache = source.kv_cache
            # the kernel rotates a k beside q: q stands in for it, its rotation unused
            q, _ = self.rotary_emb(positions, q, q, q_norm, q_norm)
            k, v = source.step_kv
        elif self.kv_cache is None:  # the start-up step before the cache exists: nothing stored
            cache = None
            q, k = self.rotary_emb(positions, q, k, q_norm, k_norm)
        else:
            cache = self.kv_cache
            slot_mapping = context.for_group(cache.group).slot_mapping
            q, k = self._rotate_and_store(positions, q, k, v, q_norm, k_norm, cache, slot_mapping)
        if self.keeps_step_kv:
            self.step_kv = (k, v)
        if cache is None:  # no prefix to read
            return self.backend.prefill(q, k, v, None, None, context, self.scale, **self.scoring).flatten(1)
        context = context.for_group(cache.group)  # the slots and block tables of the layer's cache group
        if context.is_prefill:
            o = self.backend.prefill(q, k, v, cache.k, cache.v, context, self.scale, *cache.scales, **self.scoring)
        else:
            o = self.backend.decode(q, cache.k, cache.v, context, self.scale, *cache.scales, **self.scoring)
        return o.flatten(1)
