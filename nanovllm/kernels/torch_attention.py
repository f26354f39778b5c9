"""Paged attention in plain PyTorch: the CPU path and the reference for GPU kernels.

Cache layout: k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`, i.e. flat slot `block_id * block_size + offset`.

The cache is read in place, never gathered: a run of consecutive block ids is
one strided view of the cache, each query attends over each run (and over its
own new tokens) separately, and the partial results are combined by their
log-sum-exp, the way a paged flash-attention kernel combines its tiles.

An FP8 cache (`fp8_kv`) comes with its scales, k_scale, v_scale: [num_blocks,
kv_heads, block_size]; each run is dequantized to the queries' dtype as it is
read, and a prefill's new tokens are attended as the cache gives them back, so
a prompt attends the same keys whether its prefix was cached or computed.
"""

import torch

from nanovllm.kernels.fp8_kv import dequantize_heads, quantize_heads, round_trip
from nanovllm.utils.context import Context


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over k/v and its log-sum-exp; `causal` aligns q with the last keys.

    q: [heads, q_len, d]; k, v: [kv_heads, k_len, d] -> o: [heads, q_len, d], lse: [heads, q_len] (fp32)
    """
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if q.device.type == "cpu":
        # PyTorch's fused CPU kernel, which also reports the log-sum-exp and reads
        # grouped K/V heads without repeating them (q_len == k_len when causal)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, 0.0, causal, scale=scale)[:2]
    else:
        o, lse = _attend_written_out(q4, k4, v4, causal, scale)
    return o[0], lse[0]


def _attend_written_out(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # the textbook formula, for devices without a fused kernel that reports the log-sum-exp
    # (it is the oracle of the GPU kernels' tests): scores and softmax in fp32, the weights in
    # the values' dtype for the product with them, as flash-attention kernels do
    # q4: [1, heads, q_len, d]; k4, v4: [1, kv_heads, k_len, d]
    group = q4.size(1) // k4.size(1)
    k4, v4 = k4.repeat_interleave(group, 1), v4.repeat_interleave(group, 1)
    scores = (q4.float() @ k4.float().transpose(-1, -2)) * scale  # [1, heads, q_len, k_len]
    if causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(k_len - q_len + 1), float("-inf"))
    lse = scores.logsumexp(-1)  # [1, heads, q_len]
    o = (scores - lse.unsqueeze(-1)).exp().to(v4.dtype) @ v4
    return o, lse


def _heads_first(cache: torch.Tensor) -> torch.Tensor:
    # [num_blocks, block_size, kv_heads, d] -> a view [kv_heads, num_blocks, block_size, d]
    return cache.permute(2, 0, 1, 3)


def _block_runs(block_ids: list[int], num_tokens: int, block_size: int) -> list[tuple[int, int]]:
    """The first `num_tokens` cached tokens of a sequence as runs of blocks that are one strided
    view each: (first block id, tokens from its start).

    Keys read without a mask may come in any order, so the full blocks are sorted and
    each range of consecutive ids is one run; a partly filled last block closes the
    range just below it, or is a run of its own.
    """
    num_full, rest = divmod(num_tokens, block_size)
    runs: list[list[int]] = []  # [first id, tokens]
    for block_id in sorted(block_ids[:num_full]):
        if runs and runs[-1][0] + runs[-1][1] // block_size == block_id:
            runs[-1][1] += block_size
        else:
            runs.append([block_id, block_size])
    if rest:
        last = block_ids[num_full]
        below = next((run for run in runs if run[0] + run[1] // block_size == last), None)
        if below is None:
            runs.append([last, rest])
        else:
            below[1] += rest
    return [(first, tokens) for first, tokens in runs]


def _view(cache: torch.Tensor, first: int, num_tokens: int) -> torch.Tensor:
    """`num_tokens` tokens of a heads-first cache ([kv_heads, blocks, block_size, ...]) from the start of
    block `first`, without a copy: [kv_heads, num_tokens, ...]."""
    block_size = cache.size(2)
    return cache[:, first : first + (num_tokens + block_size - 1) // block_size].flatten(1, 2)[:, :num_tokens]


class _CacheReader:
    """One layer's paged K/V, read a run of blocks at a time as [kv_heads, tokens, d] in `dtype`."""

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
        dtype: torch.dtype,
    ):
        self.k, self.v = _heads_first(k_cache), _heads_first(v_cache)
        # scales: [num_blocks, kv_heads, block_size] -> views [kv_heads, num_blocks, block_size]
        self.scales = None if k_scale is None else (k_scale.transpose(0, 1), v_scale.transpose(0, 1))
        self.dtype = dtype
        self.block_size = k_cache.size(1)

    def run(self, first: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = _view(self.k, first, num_tokens), _view(self.v, first, num_tokens)
        if self.scales is None:
            return k, v
        k_scale, v_scale = (_view(s, first, num_tokens) for s in self.scales)
        return dequantize_heads(k, k_scale, self.dtype), dequantize_heads(v, v_scale, self.dtype)


def _attend_cached(
    q: torch.Tensor, cache: _CacheReader, block_ids: list[int], num_tokens: int, scale: float, row: int
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Attention of q ([heads, q_len, d], output rows from `row`) over a sequence's first `num_tokens`
    cached tokens, one part per run of blocks, for `_combine`."""
    return [
        (*_attend(q, *cache.run(first, tokens), False, scale), row)
        for first, tokens in _block_runs(block_ids, num_tokens, cache.block_size)
    ]


def _combine(parts: list[tuple[torch.Tensor, torch.Tensor, int]], num_rows: int) -> torch.Tensor:
    """Merge partial attention results into rows of the output by their log-sum-exp.

    parts: (o [heads, n, d], lse [heads, n], first output row), in row order, together
    covering every row at least once -> [num_rows, heads, d]
    """
    o = torch.cat([p[0] for p in parts], dim=1).transpose(0, 1)  # [R, heads, d]
    if o.size(0) == num_rows:  # one part per row, appended in row order: nothing to merge
        return o
    lse = torch.cat([p[1] for p in parts], dim=1).transpose(0, 1)  # [R, heads]
    rows = torch.tensor(
        [row for p, _, first in parts for row in range(first, first + p.size(1))], device=o.device
    )  # [R]: the output row of each partial row
    heads, dtype, o = lse.size(1), o.dtype, o.float()
    peak = lse.new_full((num_rows, heads), float("-inf")).scatter_reduce_(
        0, rows[:, None].expand(-1, heads), lse, "amax"
    )
    weight = (lse - peak[rows]).exp()  # [R, heads]
    total = lse.new_zeros(num_rows, heads).index_add_(0, rows, weight)
    merged = o.new_zeros(num_rows, heads, o.size(-1)).index_add_(0, rows, o * weight.unsqueeze(-1))
    return (merged / total.unsqueeze(-1)).to(dtype)


def store_kvcache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k[t], v[t] to flat cache slot `slot_mapping[t]`; slot -1 is skipped. With scales the cache
    is FP8: each head is quantized and its scale written beside it."""
    # k, v: [tokens, kv_heads, d]; slot_mapping: [tokens]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = k_cache.size(1)
    for x, cache, scales in ((k[keep], k_cache, k_scale), (v[keep], v_cache, v_scale)):
        if scales is not None:
            x, head_scales = quantize_heads(x)
            scales[slots // block_size, :, slots % block_size] = head_scales
        cache.flatten(0, 1)[slots] = x


class TorchAttentionBackend:
    """Attends over the paged cache in place.

    Decode shapes depend on each sequence's length, a host-side number, so this
    backend cannot be captured in a CUDA graph.
    """

    supports_cuda_graphs = False

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
    ) -> torch.Tensor:
        """Causal attention of each sequence's new tokens over its cached prefix and themselves."""
        # q: [tokens, heads, d]; k, v: [tokens, kv_heads, d] (this step's, also in the cache)
        tables = None
        if context.block_tables is not None:  # some sequence reads a cached prefix (else the cache may be unset)
            tables = context.block_tables.tolist()
            cache = _CacheReader(k_cache, v_cache, k_scale, v_scale, q.dtype)
        if k_scale is not None:
            k, v = round_trip(k), round_trip(v)
        parts, start = [], 0
        for i, (q_len, k_len) in enumerate(zip(context.seqlens_q, context.seqlens_k)):
            new = slice(start, start + q_len)
            q_new = q[new].transpose(0, 1)  # [heads, q_len, d]
            if tables is not None:
                parts += _attend_cached(q_new, cache, tables[i], k_len - q_len, scale, start)
            parts.append((*_attend(q_new, k[new].transpose(0, 1), v[new].transpose(0, 1), True, scale), start))
            start += q_len
        return _combine(parts, q.size(0))

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        context: Context,
        scale: float,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One query per sequence over its `context_lens[i]` cached tokens."""
        # q: [seqs, heads, d]; block_tables: [seqs, max_blocks]
        cache = _CacheReader(k_cache, v_cache, k_scale, v_scale, q.dtype)
        queries = q.unsqueeze(2)  # [seqs, heads, 1, d]
        parts = []
        for i, (table, length) in enumerate(zip(context.block_tables.tolist(), context.context_lens.tolist())):
            parts += _attend_cached(queries[i], cache, table, length, scale, i)
        return _combine(parts, q.size(0))
