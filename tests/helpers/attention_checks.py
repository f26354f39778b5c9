"""Checks of the Triton attention kernels against the PyTorch backend, and the shapes and scorings they run
at, shared by the attention kernel tests of every head_dim."""

from dataclasses import replace

import pytest
import torch

from nanovllm.kernels import triton_decode_attention
from nanovllm.kernels.fp8_kv import quantize_paged_cache
from nanovllm.kernels.torch_attention import TorchAttentionBackend, store_kvcache
from nanovllm.kernels.triton_attention import TritonAttentionBackend
from nanovllm.kernels.triton_decode_attention import decode_attention
from nanovllm.kernels.triton_norm_rotary_store import norm_rotate_store
from nanovllm.layers.rotary_embedding import RotaryEmbedding, norm_rotate_qk_reference
from nanovllm.utils.context import Context

from helpers.paged_cases import paged_case, spread_blocks

CUDA = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
interpreter = pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def stored(case, fp8=False, spread=False):
    """The case's caches after the new K/V were stored (the store is tested with the rotary kernel):
    (k_cache, v_cache), and for an FP8 cache their scales too; `spread`: each a view whose blocks lie
    apart (`spread_blocks`)."""
    if fp8:
        (k_cache, k_scale), (v_cache, v_scale) = quantize_paged_cache(case.k_cache), quantize_paged_cache(case.v_cache)
        caches = (k_cache, v_cache, k_scale, v_scale)
    else:
        caches = (case.k_cache.clone(), case.v_cache.clone())
    if spread:
        caches = tuple(spread_blocks(cache) for cache in caches)
    store_kvcache(case.k, case.v, *caches[:2], case.slot_mapping, *caches[2:])
    return caches


def nan_before(case, caches, first_seen):
    """The caches (and an FP8 cache's scales, as the interpreter reads an FP8 NaN as 480) with every slot
    of sequence i before position first_seen[i] set to NaN, in place."""
    block_size = caches[0].size(1)
    for table, first in zip(case.block_tables.tolist(), first_seen):
        for pos in range(first):
            block, offset = table[pos // block_size], pos % block_size
            for cache in caches[:2]:
                cache[block, offset] = float("nan")
            for scales in caches[2:]:  # [num_blocks, kv_heads, block_size]
                scales[block, :, offset] = float("nan")
    return caches


def check_prefill(case, fp8=False, nan_outside=False, spread=False, **scoring):
    """`scoring`: window, softcap and sinks, passed to both backends; `nan_outside`: the cache holds NaN before
    each sequence's first query's window, which neither may read; `spread`: the caches' blocks lie apart."""
    caches = stored(case, fp8, spread)
    if nan_outside:
        nan_before(case, caches, [max(0, c - scoring["window"] + 1) for c in case.cached])
    context, scale = case.prefill_context(), case.q.size(-1) ** -0.5
    if fp8:  # every key is read through the block tables
        context = replace(context, block_tables=case.block_tables)
    args = (case.q, case.k, case.v, *caches[:2], context, scale, *caches[2:])
    want = TorchAttentionBackend().prefill(*args, **scoring)
    got = TritonAttentionBackend().prefill(*args, **scoring)
    torch.testing.assert_close(got, want, atol=TOLERANCE[case.q.dtype], rtol=TOLERANCE[case.q.dtype])


def check_decode(case, num_splits=None, fp8=False, longest_first=False, nan_outside=False, spread=False, **scoring):
    """`longest_first`: the sequences start in the order the engine gives, longest context first.
    `scoring`: window, softcap and sinks; `nan_outside`: the cache holds NaN before each sequence's window;
    `spread`: the caches' blocks lie apart."""
    k_cache, v_cache, *scales = stored(case, fp8, spread)
    if nan_outside:
        nan_before(case, (k_cache, v_cache), [max(0, n - scoring["window"]) for n in case.lengths])
    context, scale = case.decode_context(), case.q.size(-1) ** -0.5
    want = TorchAttentionBackend().decode(case.q, k_cache, v_cache, context, scale, *scales, **scoring)
    order = torch.argsort(context.context_lens, descending=True) if longest_first else None
    got = decode_attention(
        case.q,
        k_cache,
        v_cache,
        context.block_tables,
        context.context_lens,
        scale,
        num_splits,
        seq_order=order,
        **dict(zip(["k_scale", "v_scale"], scales)),
        **scoring,
    )
    torch.testing.assert_close(got, want, atol=TOLERANCE[case.q.dtype], rtol=TOLERANCE[case.q.dtype])


def decode_case(lengths, **kw):
    return paged_case(lengths, [n - 1 for n in lengths], **kw)


def verify_case(lengths, queries, **kw):
    """Sequences whose last `queries` tokens are new: a verify step's last token and drafts."""
    return paged_case(lengths, [n - queries for n in lengths], **kw)


def verify_lens(case, queries, real=None):
    """[seqs * queries]: the keys each query sees, its position + 1. With `real` (per sequence, at most
    `queries`) only that many queries are real and the padding rows repeat the last real one's length."""
    real = real or [queries] * len(case.lengths)
    lens = [c + 1 + min(j, n - 1) for c, n in zip(case.cached, real) for j in range(queries)]
    return torch.tensor(lens, dtype=torch.int32, device=case.q.device)


def check_verify(case, queries, num_splits=None, fp8=False, longest_first=False, real=None, **scoring):
    """Decode attention of `queries` queries per sequence against the PyTorch backend's prefill of the same
    tokens over their cached prefix: each query sees the cache up to itself. The PyTorch backend's own
    decode of the same rows must agree too. With `real`, only each sequence's real rows are compared."""
    caches = stored(case, fp8)
    scale = case.q.size(-1) ** -0.5
    context = replace(case.prefill_context(), block_tables=case.block_tables)
    want = TorchAttentionBackend().prefill(case.q, case.k, case.v, *caches[:2], context, scale, *caches[2:], **scoring)
    lens = verify_lens(case, queries, real)
    decode_context = Context(context_lens=lens, block_tables=case.block_tables, queries_per_seq=queries)
    order = torch.argsort(lens[queries - 1 :: queries], descending=True) if longest_first else None
    got = decode_attention(
        case.q,
        *caches[:2],
        case.block_tables,
        lens,
        scale,
        num_splits,
        seq_order=order,
        queries=queries,
        **dict(zip(["k_scale", "v_scale"], caches[2:])),
        **scoring,
    )
    by_query = TorchAttentionBackend().decode(case.q, *caches[:2], decode_context, scale, *caches[2:], **scoring)
    rows = [s * queries + j for s, n in enumerate(real or [queries] * len(case.lengths)) for j in range(n)]
    tolerance = dict(atol=TOLERANCE[case.q.dtype], rtol=TOLERANCE[case.q.dtype])
    torch.testing.assert_close(got[rows], want[rows], **tolerance)
    torch.testing.assert_close(by_query[rows], want[rows], **tolerance)
    assert torch.isfinite(got).all()


class NanFilledEmpty:
    """torch, except that `empty` fills float tensors with NaN: a kernel that reads memory no
    kernel wrote returns NaN."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, **kwargs):
        tensor = torch.empty(*shape, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor


def check_decode_reads_only_written_splits(monkeypatch, case, num_splits):
    # short contexts leave splits empty: they write no output, so the merge must not read theirs
    monkeypatch.setattr(triton_decode_attention, "torch", NanFilledEmpty())
    check_decode(case, num_splits)


def sinks_for(case) -> torch.Tensor:
    """One sink logit per query head of `case`, from below its scores to far above them (gpt-oss's range)."""
    heads = case.q.size(1)
    return torch.linspace(-3.0, 8.0, heads, device=case.q.device)


# a 12-token window, shorter than the fp32 kernel's 32-row query tiles, so some rows of a tile see no key
# of the first tiles swept; a soft-cap of 2 (these random scores reach about 4)
SCORINGS = [dict(window=12), dict(softcap=2.0), dict(window=12, softcap=2.0)]
SCORING_IDS = ["window", "softcap", "window-softcap"]

GPU_LENGTHS = [1, 15, 16, 17, 255, 256, 257, 1000, 3000]

# Gemma's scoring at GPU sizes: a 100-token window, which most contexts reach far past, and a soft-cap of
# 2, which these random scores exceed; with neither, head_dim 256 alone
GPU_SCORINGS = [dict(), dict(window=100), dict(softcap=2.0), dict(window=100, softcap=2.0)]
GPU_SCORING_IDS = ["plain", "window", "softcap", "window-softcap"]


def check_decode_replayed_in_a_graph(num_splits, head_dim, scoring, heads=16, kv_heads=8):
    """The decode step's chain as the graphs run it: the rotary kernel stores each sequence's newest
    key and value, and the decode kernels (launched early under programmatic dependent launch)
    must read them. Each replay stores new ones, so a stale read would not match the reference.
    `scoring`: window, softcap, and sinks=True for `sinks_for`'s."""
    torch.manual_seed(0)
    lengths = [1, 17, 64, 65, 300, 1000]  # the newest token first, mid and last in a tile
    case = decode_case(
        lengths, block_size=16, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=torch.bfloat16, device="cuda"
    )
    if scoring.get("sinks"):
        scoring = {**scoring, "sinks": sinks_for(case)}
    rotary = RotaryEmbedding(head_dim, 4096, {"rope_theta": 1e6, "rope_type": "default"}).cuda()
    context, scale = case.decode_context(), head_dim**-0.5
    positions = context.context_lens.long() - 1
    q, k, v = case.q.clone(), case.k.clone(), case.v.clone()
    k_cache, v_cache = case.k_cache.clone(), case.v_cache.clone()

    def step():
        q_rotated, _ = norm_rotate_store(
            positions, q, k, rotary.cos_sin, None, None, 0.0, v, k_cache, v_cache, case.slot_mapping
        )
        return decode_attention(
            q_rotated, k_cache, v_cache, context.block_tables, context.context_lens, scale, num_splits, **scoring
        )

    step()  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        want_q, want_k = norm_rotate_qk_reference(positions, q, k, rotary.cos_sin, None, None, 0.0)
        want_k_cache, want_v_cache = k_cache.clone(), v_cache.clone()
        store_kvcache(want_k, v, want_k_cache, want_v_cache, case.slot_mapping)
        want = TorchAttentionBackend().decode(want_q, want_k_cache, want_v_cache, context, scale, **scoring)
        torch.testing.assert_close(out, want, atol=TOLERANCE[torch.bfloat16], rtol=TOLERANCE[torch.bfloat16])
