"""Random paged-attention inputs shared by the attention-backend tests."""

from dataclasses import dataclass

import torch

from nanovllm.utils.context import Context


@dataclass
class PagedCase:
    """Sequences whose first `cached[i]` tokens sit in a scattered paged cache and whose rest are new."""

    q: torch.Tensor  # [new tokens, heads, d]
    k: torch.Tensor  # [new tokens, kv_heads, d]
    v: torch.Tensor
    k_cache: torch.Tensor  # [blocks, block_size, kv_heads, d]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [seqs, max_blocks], -1 pads
    slot_mapping: torch.Tensor  # [new tokens]
    lengths: list[int]
    cached: list[int]

    def prefill_context(self) -> Context:
        q_lens = [n - c for n, c in zip(self.lengths, self.cached)]
        device = self.q.device
        cumulative = lambda xs: torch.tensor([0] + list(torch.tensor(xs).cumsum(0)), dtype=torch.int32, device=device)
        return Context(
            is_prefill=True,
            slot_mapping=self.slot_mapping,
            cu_seqlens_q=cumulative(q_lens),
            cu_seqlens_k=cumulative(self.lengths),
            max_seqlen_q=max(q_lens),
            max_seqlen_k=max(self.lengths),
            seqlens_q=q_lens,
            seqlens_k=list(self.lengths),
            block_tables=self.block_tables if any(self.cached) else None,
        )

    def decode_context(self) -> Context:
        return Context(
            is_prefill=False,
            slot_mapping=self.slot_mapping,
            max_seqlen_k=max(self.lengths),
            context_lens=torch.tensor(self.lengths, dtype=torch.int32, device=self.q.device),
            block_tables=self.block_tables,
        )


def paged_case(
    lengths: list[int],
    cached: list[int],
    block_size: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype=torch.float32,
    device="cpu",
    seed: int = 0,
) -> PagedCase:
    """Random q/k/v; the cached prefixes are written into the cache, every other slot holds noise."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)
    blocks_needed = [(n + block_size - 1) // block_size for n in lengths]
    num_blocks = sum(blocks_needed) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for need in blocks_needed:
        tables.append(pool[:need])
        pool = pool[need:]
    width = max(blocks_needed)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)
    k_cache, v_cache = (
        randn(num_blocks, block_size, kv_heads, head_dim),
        randn(num_blocks, block_size, kv_heads, head_dim),
    )
    slots = [
        table[p // block_size] * block_size + p % block_size
        for table, n, c in zip(tables, lengths, cached)
        for p in range(c, n)
    ]
    new = len(slots)
    return PagedCase(
        q=randn(new, heads, head_dim),
        k=randn(new, kv_heads, head_dim),
        v=randn(new, kv_heads, head_dim),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        lengths=list(lengths),
        cached=list(cached),
    )


def spread_blocks(cache: torch.Tensor) -> torch.Tensor:
    """`cache` [blocks, ...] copied into the second half of each block of a tensor twice as wide, whose
    first halves hold NaN: a layer's view in a cache whose blocks hold two layers' K (or V) side by side,
    its blocks strided."""
    flat = cache.reshape(cache.size(0), -1)
    wide = torch.full((cache.size(0), 2 * flat.size(1)), float("nan"), dtype=cache.dtype, device=cache.device)
    wide[:, flat.size(1) :] = flat
    return wide[:, flat.size(1) :].view(cache.shape)
