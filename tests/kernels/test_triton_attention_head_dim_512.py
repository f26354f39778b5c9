"""The Triton attention kernels at head_dim 512 (Gemma 4's global layers), whose tiles are shaped apart
(triton_attention_tile_shapes.py), against the PyTorch backend: under the interpreter on tiny shapes,
compiled on a GPU at a global layer's (8 query heads on one KV head)."""

import pytest
import torch

from helpers.paged_cases import paged_case

pytest.importorskip("triton")
from helpers.attention_checks import (  # noqa: E402
    GPU_LENGTHS,
    GPU_SCORING_IDS,
    GPU_SCORINGS,
    SCORING_IDS,
    SCORINGS,
    check_decode,
    check_decode_reads_only_written_splits,
    check_decode_replayed_in_a_graph,
    check_prefill,
    check_verify,
    decode_case,
    interpreter,
    requires_gpu,
    sinks_for,
    verify_case,
)

# ---- CPU, interpreted, tiny shapes: fp32 tiles are 32 x 16 (prefill) and 16 keys (decode), bf16's 64 x 32
# and 32 keys, so these lengths cross tile and page (16) edges. bf16 runs over an FP8 cache only: the
# interpreter's bf16 tl.dot is wrong at any head_dim, while an FP8 cache's tiles meet bf16 queries in fp16 ----

TINY = dict(heads=2, kv_heads=1, head_dim=512)
TINY_DECODE = dict(heads=4, kv_heads=1, head_dim=512)
DTYPES = [torch.float32, torch.bfloat16]


@interpreter
@pytest.mark.parametrize("cached", [[0, 0], [17, 5]])
def test_prefill_interpreted(cached):
    check_prefill(paged_case([37, 21], cached, block_size=16, **TINY))


@interpreter
def test_prefill_of_a_mixed_batch_interpreted():
    # decodes beside prompt chunks whose prefix ends mid-block or on a block edge, and a one-token prompt
    check_prefill(paged_case([17, 40, 1, 50], [16, 21, 0, 32], block_size=16, **TINY))


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cached", [[0, 0], [17, 5]])
def test_prefill_over_an_fp8_cache_interpreted(cached, dtype):
    check_prefill(paged_case([37, 21], cached, block_size=16, dtype=dtype, **TINY), fp8=True)


@interpreter
@pytest.mark.parametrize("scoring", SCORINGS, ids=SCORING_IDS)
def test_prefill_with_window_and_softcap_interpreted(scoring):
    check_prefill(paged_case([37, 21], [17, 5], block_size=16, **TINY), **scoring)


@interpreter
@pytest.mark.parametrize("fp8", [False, True])
def test_windowed_prefill_reads_nothing_before_the_first_querys_window_interpreted(fp8):
    check_prefill(paged_case([45, 21], [30, 17], block_size=16, **TINY), fp8=fp8, nan_outside=True, window=12)


@interpreter
@pytest.mark.parametrize("window", [None, 12])
def test_prefill_with_sinks_interpreted(window):
    case = paged_case([37, 21], [17, 5], block_size=16, **TINY)
    check_prefill(case, window=window, sinks=sinks_for(case))


@interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_interpreted(num_splits):
    check_decode(decode_case([1, 17, 50], block_size=16, **TINY_DECODE), num_splits)


@interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_over_an_fp8_cache_interpreted(num_splits, dtype):
    check_decode(decode_case([1, 17, 50], block_size=16, dtype=dtype, **TINY_DECODE), num_splits, fp8=True)


@interpreter
@pytest.mark.parametrize("scoring", SCORINGS, ids=SCORING_IDS)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_with_window_and_softcap_interpreted(num_splits, scoring):
    check_decode(decode_case([1, 17, 50], block_size=16, **TINY_DECODE), num_splits, **scoring)


@interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
def test_windowed_decode_reads_only_its_window_interpreted(num_splits):
    case = decode_case([1, 17, 50], block_size=16, **TINY_DECODE)
    check_decode(case, num_splits, nan_outside=True, window=12, softcap=2.0)


@interpreter
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_with_sinks_interpreted(num_splits, fp8):
    case = decode_case([1, 17, 50], block_size=16, **TINY_DECODE)
    check_decode(case, num_splits, fp8=fp8, window=12, sinks=sinks_for(case))


@interpreter
def test_decode_interpreted_reads_no_output_of_an_empty_split(monkeypatch):
    check_decode_reads_only_written_splits(monkeypatch, decode_case([1, 17, 50], block_size=16, **TINY_DECODE), 3)


@interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("queries", [2, 5])
def test_verify_interpreted(num_splits, queries):
    check_verify(verify_case([6, 33, 50], queries, block_size=16, **TINY), queries, num_splits)


@interpreter
@pytest.mark.parametrize("fp8", [False, True])
def test_verify_with_padding_rows_interpreted(fp8):
    case = verify_case([9, 40], 4, block_size=16, **TINY)
    check_verify(case, 4, num_splits=2, fp8=fp8, real=[1, 4])
    check_verify(case, 4, num_splits=1, fp8=fp8, real=[3, 2], longest_first=True)


@interpreter
@pytest.mark.parametrize("scoring", [*SCORINGS, dict(sinks=True)], ids=[*SCORING_IDS, "sinks"])
def test_verify_with_window_softcap_and_sinks_interpreted(scoring):
    case = verify_case([10, 40], 3, block_size=16, **TINY)
    if scoring.get("sinks"):
        scoring = dict(sinks=sinks_for(case))
    check_verify(case, 3, num_splits=2, **scoring)


# ---- GPU, compiled: a global layer's heads, a few hundred to a few thousand tokens ----

GLOBAL_LAYER = dict(heads=8, kv_heads=1, head_dim=512)
PREFILL_LENGTHS = [1, 40, 300, 257, 1100, 700]
# the last: a chunked-prefill step mixing decodes (one query each) with prompt chunks
PREFILL_CACHED = [[0] * 6, [0, 16, 256, 240, 512, 17], [0, 39, 299, 200, 1099, 512]]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("cached", PREFILL_CACHED)
@pytest.mark.parametrize("scoring", GPU_SCORINGS, ids=GPU_SCORING_IDS)
def test_prefill_on_gpu(dtype, block_size, cached, scoring):
    case = paged_case(PREFILL_LENGTHS, cached, block_size=block_size, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_prefill(case, **scoring)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cached", PREFILL_CACHED[::2])
@pytest.mark.parametrize("scoring", [dict(), dict(window=100, softcap=2.0)], ids=["plain", "window-softcap"])
def test_prefill_over_an_fp8_cache_on_gpu(dtype, cached, scoring):
    case = paged_case(PREFILL_LENGTHS, cached, block_size=16, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_prefill(case, fp8=True, nan_outside="window" in scoring, **scoring)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 128])
def test_prefill_with_sinks_on_gpu(dtype, window):
    case = paged_case(PREFILL_LENGTHS, PREFILL_CACHED[2], block_size=16, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_prefill(case, window=window, sinks=sinks_for(case))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 256])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize("scoring", GPU_SCORINGS, ids=GPU_SCORING_IDS)
def test_decode_on_gpu(dtype, block_size, num_splits, scoring):
    torch.manual_seed(0)
    case = decode_case(GPU_LENGTHS, block_size=block_size, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_decode(case, num_splits, nan_outside="window" in scoring, **scoring)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize("group", [1, 8])
def test_decode_over_an_fp8_cache_on_gpu(dtype, num_splits, group):
    case = decode_case(
        GPU_LENGTHS, block_size=16, heads=2 * group, kv_heads=2, head_dim=512, dtype=dtype, device="cuda"
    )
    check_decode(case, num_splits, fp8=True)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize("window", [None, 128])
def test_decode_and_verify_with_sinks_on_gpu(dtype, num_splits, window):
    case = decode_case(GPU_LENGTHS, block_size=16, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_decode(case, num_splits, window=window, sinks=sinks_for(case))
    case = verify_case([n + 4 for n in GPU_LENGTHS], 4, block_size=16, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    check_verify(case, 4, num_splits, window=window, sinks=sinks_for(case))


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@pytest.mark.parametrize("queries", [2, 5, 8])  # 8 queries of a group of 8: 64 rows a KV head, on 8 warps
@pytest.mark.parametrize("fp8", [False, True])
def test_verify_on_gpu(dtype, num_splits, queries, fp8):
    torch.manual_seed(0)
    lengths = [n + queries for n in GPU_LENGTHS]
    case = verify_case(lengths, queries, block_size=16, dtype=dtype, device="cuda", **GLOBAL_LAYER)
    real = [1 + i % queries for i in range(len(lengths))]
    check_verify(case, queries, num_splits, fp8=fp8, real=real, longest_first=num_splits == 1)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("num_splits", [None, 1])
@pytest.mark.parametrize(
    "scoring", [{}, dict(window=100, softcap=2.0), dict(sinks=True)], ids=["plain", "window-softcap", "sinks"]
)
def test_decode_replayed_in_a_graph_reads_the_key_and_value_stored_just_before_it(num_splits, scoring):
    check_decode_replayed_in_a_graph(num_splits, 512, scoring, heads=8, kv_heads=1)
