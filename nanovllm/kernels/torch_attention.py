"""Paged attention in plain PyTorch: the CPU path and the reference for GPU kernels.

Cache layout: k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim];
token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`, i.e. flat slot `block_id * block_size + offset`.

A sequence whose blocks lie in one run of consecutive ids is read in place, as
one strided view of the cache; one whose blocks are scattered (small blocks,
handed out to several growing sequences in turn) is gathered into one tensor
first, since a call per block would cost more than the copy. Each query attends
over its cached keys and over its own new tokens separately, and the partial
results are combined by their log-sum-exp, the way a paged flash-attention
kernel combines its tiles.

An FP8 cache (`fp8_kv`) comes with its scales, k_scale, v_scale: [num_blocks,
kv_heads, block_size]; each run is dequantized to the queries' dtype as it is
read, and a prefill's new tokens are attended as the cache gives them back, so
a prompt attends the same keys whether its prefix was cached or computed.

A sliding window (`window` W: a query at position p sees keys p - W + 1 .. p)
bounds what is read: a decode reads its last W keys only, and a prefill the
prefix from the first query's window on, in position order, masking each query's
keys by position. A soft-cap (`softcap` c) turns each score s into c * tanh(s / c)
before the softmax. Either takes the written-out formula, as PyTorch's fused CPU
kernel has neither.

An attention sink (`sinks`: one logit per head) joins each query's softmax sum and
takes no value: it is one more part to combine, of output zero and log-sum-exp
the sink (`_sink_part`).
"""

from dataclasses import dataclass

import torch

from nanovllm.kernels.fp8_kv import dequantize_heads, quantize_heads, round_trip
from nanovllm.utils.context import Context


@dataclass(frozen=True)
class _Scoring:
    """How a layer scores keys: the scale, the soft-cap (None: none) and the sliding window (None: every earlier
    key is seen)."""

    scale: float
    softcap: float | None = None
    window: int | None = None


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scoring: _Scoring,
    visible: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over k/v and its log-sum-exp; `causal` aligns q with the last keys, `visible` (instead)
    marks the keys each query sees. A query that sees none of the keys gets zeros and a log-sum-exp of -inf,
    which weighs nothing in `_combine`.

    q: [heads, q_len, d]; k, v: [kv_heads, k_len, d]; visible: [q_len, k_len] bool or None
    -> o: [heads, q_len, d], lse: [heads, q_len] (fp32)
    """
    q4, k4, v4 = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    if q.device.type == "cpu" and scoring.softcap is None and visible is None:
        # PyTorch's fused CPU kernel, which also reports the log-sum-exp and reads
        # grouped K/V heads without repeating them (q_len == k_len when causal)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q4, k4, v4, 0.0, causal, scale=scoring.scale
        )[:2]
    else:
        o, lse = _attend_written_out(q4, k4, v4, causal, scoring.scale, scoring.softcap, visible)
    return o[0], lse[0]


def _attend_written_out(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    causal: bool,
    scale: float,
    softcap: float | None = None,
    visible: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # the textbook formula, for devices without a fused kernel that reports the log-sum-exp and for
    # soft-capped or windowed scores (it is the oracle of the GPU kernels' tests): scores and softmax in
    # fp32, the weights in the values' dtype for the product with them, as flash-attention kernels do
    # q4: [1, heads, q_len, d]; k4, v4: [1, kv_heads, k_len, d]; visible: [q_len, k_len]
    group = q4.size(1) // k4.size(1)
    k4, v4 = k4.repeat_interleave(group, 1), v4.repeat_interleave(group, 1)
    scores = (q4.float() @ k4.float().transpose(-1, -2)) * scale  # [1, heads, q_len, k_len]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    elif causal:
        q_len, k_len = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(k_len - q_len + 1), float("-inf"))
    lse = scores.logsumexp(-1)  # [1, heads, q_len]
    # a row that sees no key has lse -inf: subtracting 0 instead makes its weights exp(-inf) = 0, not NaN
    o = (scores - lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1)).exp().to(v4.dtype) @ v4
    return o, lse


def _visible(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys each query sees: those at or before it and fewer than `window` positions behind it."""
    # q_pos: [q_len]; k_pos: [k_len] -> [q_len, k_len] bool
    behind = q_pos[:, None] - k_pos[None, :]
    return (behind >= 0) & (behind < window)


def _heads_first(cache: torch.Tensor) -> torch.Tensor:
    # [num_blocks, block_size, kv_heads, d] -> a view [kv_heads, num_blocks, block_size, d]
    return cache.permute(2, 0, 1, 3)


def _block_runs(
    block_ids: list[int], start: int, end: int, block_size: int, in_order: bool = False
) -> list[tuple[int, int, int]]:
    """Positions start .. end - 1 of a sequence as runs of blocks that are one strided view each:
    (first block id, offset in it, tokens).

    Keys read without a mask may come in any order, so by default the blocks are sorted and each
    range of consecutive ids is one run (blocks handed out in descending order then make one run, not
    one each). `in_order` keeps position order, for keys masked by position: the runs then follow
    one another from `start`.
    """
    pieces = []  # (block id, offset, tokens) of each block the positions touch
    for index in range(start // block_size, (end + block_size - 1) // block_size):
        first, last = max(start, index * block_size), min(end, (index + 1) * block_size)
        pieces.append((block_ids[index], first - index * block_size, last - first))
    if not in_order:
        pieces.sort()
    runs: list[list[int]] = []
    for block_id, offset, tokens in pieces:
        if runs and runs[-1][0] * block_size + runs[-1][1] + runs[-1][2] == block_id * block_size + offset:
            runs[-1][2] += tokens  # it starts where the run ends in the cache
        else:
            runs.append([block_id, offset, tokens])
    return [(first, offset, tokens) for first, offset, tokens in runs]


def _view(cache: torch.Tensor, first: int, offset: int, num_tokens: int) -> torch.Tensor:
    """`num_tokens` tokens of a heads-first cache ([kv_heads, blocks, block_size, ...]) from `offset` in
    block `first`, without a copy: [kv_heads, num_tokens, ...]."""
    block_size = cache.size(2)
    blocks = (offset + num_tokens + block_size - 1) // block_size
    return cache[:, first : first + blocks].flatten(1, 2)[:, offset : offset + num_tokens]


class _CacheReader:
    """One layer's paged K/V, read as [kv_heads, tokens, d] in `dtype`: a run of consecutive blocks in place,
    scattered blocks gathered."""

    def __init__(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k_scale: torch.Tensor | None,
        v_scale: torch.Tensor | None,
        dtype: torch.dtype,
    ):
        # caches: [num_blocks, block_size, kv_heads, d]; scales: [num_blocks, kv_heads, block_size]
        self.caches, self.scales = (k_cache, v_cache), None if k_scale is None else (k_scale, v_scale)
        self.dtype = dtype
        self.block_size = k_cache.size(1)

    def run(self, first: int, offset: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`num_tokens` tokens from `offset` in block `first`, of a run of consecutive blocks, read in place."""
        k, v = (_view(_heads_first(cache), first, offset, num_tokens) for cache in self.caches)
        if self.scales is None:
            return k, v
        # scales: views [kv_heads, num_blocks, block_size]
        k_scale, v_scale = (_view(scale.transpose(0, 1), first, offset, num_tokens) for scale in self.scales)
        return dequantize_heads(k, k_scale, self.dtype), dequantize_heads(v, v_scale, self.dtype)

    def gather(self, block_ids: list[int], offset: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`num_tokens` tokens from `offset` in the first of `block_ids`, in order, copied block by block
        (one index_select over the leading dimension each)."""
        ids = torch.tensor(block_ids, device=self.caches[0].device)
        tokens = slice(offset, offset + num_tokens)
        # [blocks, block_size, kv_heads, d] -> [kv_heads, tokens, d]
        k, v = (cache.index_select(0, ids).flatten(0, 1)[tokens].transpose(0, 1) for cache in self.caches)
        if self.scales is None:
            return k, v
        # [blocks, kv_heads, block_size] -> [kv_heads, tokens]
        k_scale, v_scale = (
            scale.index_select(0, ids).transpose(0, 1).flatten(1, 2)[:, tokens] for scale in self.scales
        )
        return dequantize_heads(k, k_scale, self.dtype), dequantize_heads(v, v_scale, self.dtype)


def _attend_cached(
    q: torch.Tensor,
    cache: _CacheReader,
    block_ids: list[int],
    start: int,
    end: int,
    scoring: _Scoring,
    row: int,
    q_pos: torch.Tensor | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """Attention of q ([heads, q_len, d], output rows from `row`) over a sequence's cached positions
    start .. end - 1, for `_combine`: one part when its blocks are one run (or gathered into one), else
    one per run. With `q_pos` (the queries' positions [q_len]) each query sees only the keys in its window;
    without, every query sees every key."""
    runs = _block_runs(block_ids, start, end, cache.block_size, in_order=q_pos is not None)
    if len(runs) > 1:
        bs = cache.block_size
        k, v = cache.gather(block_ids[start // bs : (end + bs - 1) // bs], start % bs, end - start)
        visible = None
        if q_pos is not None:
            visible = _visible(q_pos, torch.arange(start, end, device=q_pos.device), scoring.window)
        return [(*_attend(q, k, v, False, scoring, visible), row)]
    parts, position = [], start
    for first, offset, tokens in runs:
        visible = None
        if q_pos is not None:
            visible = _visible(q_pos, torch.arange(position, position + tokens, device=q_pos.device), scoring.window)
        parts.append((*_attend(q, *cache.run(first, offset, tokens), False, scoring, visible), row))
        position += tokens
    return parts


def _in_row_order(parts: list[tuple[torch.Tensor, torch.Tensor, int]], num_rows: int) -> bool:
    """Whether the parts cover rows 0 .. num_rows - 1 once each, in order (a padding row of a decode step
    has no part, so counting rows alone could pair parts with the wrong rows)."""
    expected = 0
    for o, _, first in parts:
        if first != expected:
            return False
        expected += o.size(1)
    return expected == num_rows


def _combine(parts: list[tuple[torch.Tensor, torch.Tensor, int]], num_rows: int) -> torch.Tensor:
    """Merge partial attention results into rows of the output by their log-sum-exp.

    parts: (o [heads, n, d], lse [heads, n], first output row), in row order, together
    covering every row at least once -> [num_rows, heads, d]
    """
    o = torch.cat([p[0] for p in parts], dim=1).transpose(0, 1)  # [R, heads, d]
    if _in_row_order(parts, num_rows):  # nothing to merge
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


def _sink_part(sinks: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A part for `_combine` that adds each head's sink logit to the softmax sum of every row of q: output zero
    (in q's dtype, the other parts' own), its log-sum-exp the sink."""
    # sinks: [heads]; q: [rows, heads, d] -> o [heads, rows, d], lse [heads, rows] (fp32), first row 0
    lse = sinks.float()[:, None].expand(-1, q.size(0))
    return q.new_zeros(sinks.size(0), q.size(0), q.size(-1)), lse, 0


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
        cache[slots // block_size, slots % block_size] = x  # a view whose blocks may lie apart: no flatten


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
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of each sequence's new tokens over its cached prefix and themselves (the last
        `window` positions of each query's, when given; scores soft-capped at `softcap`, when given; each
        head's `sinks` logit in its softmax sum, when given)."""
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
            k_new, v_new = k[new].transpose(0, 1), v[new].transpose(0, 1)  # [kv_heads, q_len, d]
            # a window that holds the whole sequence changes nothing: the plain causal path then
            scoring = _Scoring(scale, softcap, window if window is not None and window < k_len else None)
            prefix_len = k_len - q_len
            if scoring.window is None:
                if tables is not None:
                    parts += _attend_cached(q_new, cache, tables[i], 0, prefix_len, scoring, start)
                parts.append((*_attend(q_new, k_new, v_new, True, scoring), start))
            else:
                q_pos = torch.arange(prefix_len, k_len, device=q.device)  # [q_len]
                if tables is not None:  # from the first query's window on
                    first = max(0, prefix_len - scoring.window + 1)
                    parts += _attend_cached(q_new, cache, tables[i], first, prefix_len, scoring, start, q_pos)
                visible = _visible(q_pos, q_pos, scoring.window)
                parts.append((*_attend(q_new, k_new, v_new, True, scoring, visible), start))
            start += q_len
        if sinks is not None:
            parts.append(_sink_part(sinks, q))
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
        *,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each query over its `context_lens[i]` cached tokens (the last `window` of them, when given; scores
        soft-capped at `softcap`, when given; each head's `sinks` logit in its softmax sum, when given)."""
        # q: [queries, heads, d]; query_block_tables(): [queries, max_blocks]
        cache = _CacheReader(k_cache, v_cache, k_scale, v_scale, q.dtype)
        scoring = _Scoring(scale, softcap, window)
        queries = q.unsqueeze(2)  # [queries, heads, 1, d]
        parts = []
        tables, lengths = context.query_block_tables().tolist(), context.context_lens.tolist()
        for i, (table, length) in enumerate(zip(tables, lengths)):
            first = 0 if window is None else max(0, length - window)  # the query sees every key read
            parts += _attend_cached(queries[i], cache, table, first, length, scoring, i)
        if sinks is not None:
            parts.append(_sink_part(sinks, q))
        return _combine(parts, q.size(0))
