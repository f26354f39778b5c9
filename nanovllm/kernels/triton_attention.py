"""The Triton attention backend: the prefill and decode kernels behind one interface."""

import torch

from nanovllm.kernels.triton_decode_attention import decode_attention
from nanovllm.kernels.triton_prefill_attention import prefill_attention
from nanovllm.utils.context import Context


class TritonAttentionBackend:
    """Paged attention with our own Triton kernels; decode reads no host-side lengths, so it can be graph-captured."""

    supports_cuda_graphs = True

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return prefill_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            context.block_tables,
            context.cu_seqlens_q,
            context.cu_seqlens_k,
            context.max_seqlen_q,
            scale,
            k_scale,
            v_scale,
            window,
            softcap,
            sinks,
        )

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return decode_attention(
            q,
            k_cache,
            v_cache,
            context.block_tables,
            context.context_lens,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
            seq_order=context.seq_order,
            window=window,
            softcap=softcap,
            queries=context.queries_per_seq,
            sinks=sinks,
        )
