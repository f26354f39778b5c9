"""The pure-PyTorch paged attention against dense attention computed the plain way."""

import math

import pytest
import torch

from nanovllm.kernels.torch_attention import TorchAttentionBackend, _attend_written_out, store_kvcache
from nanovllm.utils.context import Context

HEADS, KV_HEADS, DIM, BLOCK = 4, 2, 8, 16


def dense_attention(q, k, v, window=None, softcap=None, sinks=None):
    """Causal attention of the last len(q) positions over all len(k), by the textbook formula: each query
    sees the keys at most `window` - 1 positions behind it, each score s becomes softcap * tanh(s / softcap),
    and each head's `sinks` logit is one more score of the softmax, whose weight multiplies no value."""
    q_len, k_len = q.size(0), k.size(0)
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.size(-1))
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    q_pos, k_pos = torch.arange(q_len)[:, None] + (k_len - q_len), torch.arange(k_len)[None, :]
    allowed = (k_pos <= q_pos) & (k_pos > q_pos - (window or k_len))
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is None:
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    sink_scores = sinks[:, None, None].expand(-1, q_len, 1)
    weights = torch.cat([scores, sink_scores], -1).softmax(-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", weights, v)


def block_tables(lengths, num_blocks, seed=0, order="scattered"):
    """Each sequence's blocks drawn from a pool: shuffled (runs of one block), ascending
    (one run, read as one view), or descending (as the block manager hands out freed
    blocks, read as one sorted range plus the partly filled last block)."""
    pool = list(range(num_blocks))
    if order == "scattered":
        pool = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    elif order == "descending":
        pool.reverse()
    tables = []
    for n in lengths:
        need = (n + BLOCK - 1) // BLOCK
        tables.append(pool[:need])
        pool = pool[need:]
    width = max(map(len, tables))
    return torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)


def slots_of(table, start, end):
    return [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, end)]


@pytest.fixture
def caches():
    shape = (32, BLOCK, KV_HEADS, DIM)
    return torch.zeros(shape), torch.zeros(shape)


def test_store_writes_slots_and_skips_minus_one(caches):
    k_cache, v_cache = caches
    k, v = torch.randn(3, KV_HEADS, DIM), torch.randn(3, KV_HEADS, DIM)
    store_kvcache(k, v, k_cache, v_cache, torch.tensor([5, -1, 40]))
    assert torch.equal(k_cache[0, 5], k[0]) and torch.equal(v_cache[2, 8], v[2])
    assert k_cache.flatten(0, 1).abs().sum(-1).sum(-1).nonzero().flatten().tolist() == [5, 40]


# (window, softcap): plain; a 20-token window (shorter than some sequences, longer than others); a soft-cap
# of 1.5 (the scores of these random heads reach about 3); both
SCORINGS = [(None, None), (20, None), (None, 1.5), (20, 1.5)]


@pytest.mark.parametrize("scoring", SCORINGS, ids=["plain", "window", "softcap", "window-softcap"])
@pytest.mark.parametrize("order", ["scattered", "ascending", "descending"])
@pytest.mark.parametrize("cached", [[0, 0, 0], [16, 0, 32], [16, 10, 3], [40, 0, 35]])
def test_prefill_with_and_without_cached_prefix(caches, cached, order, scoring):
    torch.manual_seed(0)
    window, softcap = scoring
    k_cache, v_cache = caches
    backend = TorchAttentionBackend()
    totals = [56, 17, 50]
    tables = block_tables(totals, 32, order=order)
    full_k = [torch.randn(n, KV_HEADS, DIM) for n in totals]
    full_v = [torch.randn(n, KV_HEADS, DIM) for n in totals]
    q = [torch.randn(n - c, HEADS, DIM) for n, c in zip(totals, cached)]
    # the cached prefix is already in the cache
    for i, c in enumerate(cached):
        slots = torch.tensor(slots_of(tables[i].tolist(), 0, c), dtype=torch.int64)
        store_kvcache(full_k[i][:c], full_v[i][:c], k_cache, v_cache, slots)
    new_k = torch.cat([fk[c:] for fk, c in zip(full_k, cached)])
    new_v = torch.cat([fv[c:] for fv, c in zip(full_v, cached)])
    slots = torch.tensor(sum((slots_of(tables[i].tolist(), c, n) for i, (n, c) in enumerate(zip(totals, cached))), []))
    store_kvcache(new_k, new_v, k_cache, v_cache, slots)
    context = Context(
        is_prefill=True,
        seqlens_q=[n - c for n, c in zip(totals, cached)],
        seqlens_k=totals,
        block_tables=tables if any(cached) else None,
    )
    out = backend.prefill(
        torch.cat(q), new_k, new_v, k_cache, v_cache, context, DIM**-0.5, window=window, softcap=softcap
    )
    expected = torch.cat([dense_attention(qi, fk, fv, window, softcap) for qi, fk, fv in zip(q, full_k, full_v)])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("scoring", SCORINGS, ids=["plain", "window", "softcap", "window-softcap"])
@pytest.mark.parametrize("order", ["scattered", "ascending", "descending"])
def test_decode_reads_each_sequence_through_its_blocks(caches, order, scoring):
    torch.manual_seed(0)
    window, softcap = scoring
    k_cache, v_cache = caches
    backend = TorchAttentionBackend()
    lengths = [1, 16, 17, 45]
    tables = block_tables(lengths, 32, seed=1, order=order)
    full_k = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    full_v = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    for i, n in enumerate(lengths):
        slots = torch.tensor(slots_of(tables[i].tolist(), 0, n))
        store_kvcache(full_k[i], full_v[i], k_cache, v_cache, slots)
    q = torch.randn(len(lengths), HEADS, DIM)
    context = Context(
        context_lens=torch.tensor(lengths, dtype=torch.int32), max_seqlen_k=max(lengths), block_tables=tables
    )
    out = backend.decode(q, k_cache, v_cache, context, DIM**-0.5, window=window, softcap=softcap)
    expected = torch.stack(
        [dense_attention(q[i : i + 1], full_k[i], full_v[i], window, softcap)[0] for i in range(len(lengths))]
    )
    torch.testing.assert_close(out, expected)


def nan_outside_windows(tables, lengths, first_seen, full_k, full_v):
    """Caches that hold each sequence's keys and values from position first_seen[i] on and NaN everywhere
    else: attention that reads a key outside every query's window returns NaN."""
    shape = (32, BLOCK, KV_HEADS, DIM)
    k_cache, v_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    for i, (n, first) in enumerate(zip(lengths, first_seen)):
        slots = torch.tensor(slots_of(tables[i].tolist(), first, n))
        store_kvcache(full_k[i][first:], full_v[i][first:], k_cache, v_cache, slots)
    return k_cache, v_cache


@pytest.mark.parametrize("order", ["scattered", "descending"])
def test_windowed_decode_reads_only_the_keys_in_the_window(order):
    torch.manual_seed(0)
    lengths, window = [5, 30, 45], 20
    tables = block_tables(lengths, 32, order=order)
    full_k = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    full_v = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    k_cache, v_cache = nan_outside_windows(tables, lengths, [max(0, n - window) for n in lengths], full_k, full_v)
    q = torch.randn(len(lengths), HEADS, DIM)
    context = Context(context_lens=torch.tensor(lengths, dtype=torch.int32), block_tables=tables)
    out = TorchAttentionBackend().decode(q, k_cache, v_cache, context, DIM**-0.5, window=window)
    expected = torch.stack([dense_attention(q[i : i + 1], full_k[i], full_v[i], window)[0] for i in range(3)])
    torch.testing.assert_close(out, expected)


def test_windowed_prefill_reads_only_the_prefix_in_the_first_querys_window():
    torch.manual_seed(0)
    lengths, cached, window = [50, 40], [37, 10], 20  # prefixes longer and shorter than the window
    tables = block_tables(lengths, 32)
    full_k = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    full_v = [torch.randn(n, KV_HEADS, DIM) for n in lengths]
    k_cache, v_cache = nan_outside_windows(tables, lengths, [max(0, c - window + 1) for c in cached], full_k, full_v)
    q = [torch.randn(n - c, HEADS, DIM) for n, c in zip(lengths, cached)]
    context = Context(
        is_prefill=True, seqlens_q=[n - c for n, c in zip(lengths, cached)], seqlens_k=lengths, block_tables=tables
    )
    new_k = torch.cat([fk[c:] for fk, c in zip(full_k, cached)])
    new_v = torch.cat([fv[c:] for fv, c in zip(full_v, cached)])
    out = TorchAttentionBackend().prefill(
        torch.cat(q), new_k, new_v, k_cache, v_cache, context, DIM**-0.5, window=window, softcap=1.5
    )
    expected = torch.cat([dense_attention(qi, fk, fv, window, 1.5) for qi, fk, fv in zip(q, full_k, full_v)])
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("causal", [True, False])
def test_written_out_formula_matches_the_fused_kernel(causal):
    # the formula other devices use, checked here against PyTorch's fused CPU kernel
    torch.manual_seed(0)
    q = torch.randn(1, HEADS, 7, DIM)
    k, v = torch.randn(1, KV_HEADS, 7, DIM), torch.randn(1, KV_HEADS, 7, DIM)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.3)[:2]
    got = _attend_written_out(q, k, v, causal, 0.3)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_prefill_without_cached_prefixes_does_not_read_the_cache():
    # the memory-profiling forward pass runs before the cache exists
    torch.manual_seed(0)
    q, k, v = torch.randn(5, HEADS, DIM), torch.randn(5, KV_HEADS, DIM), torch.randn(5, KV_HEADS, DIM)
    context = Context(is_prefill=True, seqlens_q=[5], seqlens_k=[5])
    out = TorchAttentionBackend().prefill(q, k, v, torch.tensor([]), torch.tensor([]), context, DIM**-0.5)
    torch.testing.assert_close(out, dense_attention(q, k, v))


# one sink logit per head: below, about at, and far above these random heads' scores (the last takes
# nearly all of its rows' weight)
SINKS = torch.tensor([-3.0, 0.0, 2.0, 8.0])


@pytest.mark.parametrize("window", [None, 20])
def test_sinks_join_each_rows_softmax_sum_in_prefill_and_decode(caches, window):
    torch.manual_seed(0)
    k_cache, v_cache = caches
    backend = TorchAttentionBackend()
    totals, cached = [56, 17, 50], [16, 0, 35]
    tables = block_tables(totals, 32, order="scattered")
    full_k = [torch.randn(n, KV_HEADS, DIM) for n in totals]
    full_v = [torch.randn(n, KV_HEADS, DIM) for n in totals]
    for i, n in enumerate(totals):
        store_kvcache(full_k[i], full_v[i], k_cache, v_cache, torch.tensor(slots_of(tables[i].tolist(), 0, n)))
    q = [torch.randn(n - c, HEADS, DIM) for n, c in zip(totals, cached)]
    context = Context(
        is_prefill=True, seqlens_q=[n - c for n, c in zip(totals, cached)], seqlens_k=totals, block_tables=tables
    )
    new_k = torch.cat([fk[c:] for fk, c in zip(full_k, cached)])
    new_v = torch.cat([fv[c:] for fv, c in zip(full_v, cached)])
    out = backend.prefill(torch.cat(q), new_k, new_v, k_cache, v_cache, context, DIM**-0.5, window=window, sinks=SINKS)
    want = torch.cat([dense_attention(qi, fk, fv, window, sinks=SINKS) for qi, fk, fv in zip(q, full_k, full_v)])
    torch.testing.assert_close(out, want)
    assert not torch.allclose(out, torch.cat([dense_attention(*x, window) for x in zip(q, full_k, full_v)]))
    last = torch.stack([qi[-1] for qi in q])  # each sequence's last query, as a decode step asks it
    decode_context = Context(context_lens=torch.tensor(totals, dtype=torch.int32), block_tables=tables)
    out = backend.decode(last, k_cache, v_cache, decode_context, DIM**-0.5, window=window, sinks=SINKS)
    torch.testing.assert_close(out, _last_rows(want, [n - c for n, c in zip(totals, cached)]))


def _last_rows(rows: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The last row of each of the consecutive runs of `lengths` rows."""
    return torch.stack([part[-1] for part in rows.split(lengths)])


def test_sinks_keep_the_queries_dtype():
    # the sink's part of the softmax is made in fp32: it must not turn a bf16 layer's output into fp32
    q, k, v = torch.randn(5, HEADS, DIM), torch.randn(5, KV_HEADS, DIM), torch.randn(5, KV_HEADS, DIM)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    context = Context(is_prefill=True, seqlens_q=[5], seqlens_k=[5])
    empty = torch.tensor([], dtype=torch.bfloat16)
    out = TorchAttentionBackend().prefill(q, k, v, empty, empty, context, DIM**-0.5, sinks=SINKS)
    assert out.dtype == torch.bfloat16
    want = dense_attention(q.float(), k.float(), v.float(), sinks=SINKS)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
