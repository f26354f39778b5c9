"""Paged attention in plain PyTorch: the CPU path and the reference for GPU kernels.

Cache layout: k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`, i.e. flat slot `block_id * block_size + offset`.
"""

import torch
import torch.nn.functional as F

from nanovllm.utils.context import Context


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # q: [q_len, heads, d]; k, v: [k_len, kv_heads, d]. The queries are the last
    # q_len of the k_len positions, so query i sees keys 0 .. k_len - q_len + i.
    # As [1, heads, len, d], PyTorch's fused attention kernels take them (on the
    # CPU 8x faster than the unbatched form for a 4,000-token prompt); a whole
    # prompt is plainly causal and needs no mask.
    q_len, k_len = q.size(0), k.size(0)
    q4, k4, v4 = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    if q_len == k_len:
        o = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
        o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int) -> torch.Tensor:
    # the first num_tokens cached tokens of each sequence, read through its block table
    # a whole block at a time: a block is one run of memory, and copying runs rather than
    # token rows halved a decode step of 4 sequences at 3,000 tokens on the CPU.
    # block_tables: [seqs, max_blocks] -> [seqs, num_tokens, kv_heads, d]
    block_size = cache.size(1)
    blocks = block_tables[:, :(num_tokens + block_size - 1) // block_size].clamp_min(0).long()
    return cache[blocks].flatten(1, 2)[:, :num_tokens]


class TorchAttentionBackend:
    """Stores K/V into the paged cache and attends over it with SDPA.

    Decode shapes depend on the longest context, a host-side number, so this
    backend cannot be captured in a CUDA graph.
    """

    supports_cuda_graphs = False

    def store_kvcache(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        # k, v: [tokens, kv_heads, d]; slot_mapping: [tokens], -1 = skip
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        k_cache.flatten(0, 1)[slots] = k[keep]
        v_cache.flatten(0, 1)[slots] = v[keep]

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, context: Context, scale: float) -> torch.Tensor:
        """Causal attention of each sequence's new tokens over its prefix and themselves."""
        # q: [tokens, heads, d]; k, v: [tokens, kv_heads, d]
        o = torch.empty_like(q)
        start = 0
        for i, (q_len, k_len) in enumerate(zip(context.seqlens_q, context.seqlens_k)):
            new = slice(start, start + q_len)
            if context.block_tables is None:
                keys, values = k[new], v[new]
            else:
                table = context.block_tables[i:i + 1]
                keys = _gather(k_cache, table, k_len)[0]
                values = _gather(v_cache, table, k_len)[0]
            o[new] = _attend(q[new], keys, values, scale)
            start += q_len
        return o

    def decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               context: Context, scale: float) -> torch.Tensor:
        """One query per sequence over its `context_lens[i]` cached tokens (at most `max_seqlen_k`)."""
        # q: [seqs, heads, d]; block_tables: [seqs, max_blocks]
        positions = torch.arange(context.max_seqlen_k, device=q.device)  # [keys]
        keys = _gather(k_cache, context.block_tables, context.max_seqlen_k)  # [seqs, keys, kv_heads, d]
        values = _gather(v_cache, context.block_tables, context.max_seqlen_k)
        mask = positions < context.context_lens.unsqueeze(1)  # [seqs, keys]
        o = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True,
        )
        return o.squeeze(2)
