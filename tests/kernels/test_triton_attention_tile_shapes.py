"""The attention kernels' tile shapes: head_dim <= 256 as tuned, head_dim 512 within a Hopper SM's budgets."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_attention_tile_shapes import (  # noqa: E402
    ACCUMULATOR_REGISTERS,
    KB,
    SHARED_MEMORY_BUDGET,
    AttentionTiles,
    accumulator_registers,
    decode_tiles,
    prefill_tiles,
    shared_memory_bytes,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("head_dim", [64, 80, 128, 256])
def test_head_dims_up_to_256_keep_their_tuned_shapes(head_dim):
    assert prefill_tiles(head_dim, torch.float32) == AttentionTiles(32, 32, 4, 2)
    assert prefill_tiles(head_dim, torch.bfloat16) == AttentionTiles(64, 64, 4, 2)
    for dtype in DTYPES:
        assert decode_tiles(head_dim, dtype, False, 8) == AttentionTiles(16, 64, 4, 2)
        assert decode_tiles(head_dim, dtype, True, 40) == AttentionTiles(64, 128, 4, 2)


def test_head_dim_512_shapes():
    assert prefill_tiles(512, torch.bfloat16) == AttentionTiles(64, 32, 8, 2)
    assert prefill_tiles(512, torch.float32) == AttentionTiles(32, 16, 8, 1)
    assert decode_tiles(512, torch.bfloat16, False, 8) == AttentionTiles(16, 32, 4, 2)
    assert decode_tiles(512, torch.bfloat16, True, 64) == AttentionTiles(64, 32, 8, 2)
    assert decode_tiles(512, torch.float32, False, 8) == AttentionTiles(16, 16, 4, 2)
    assert decode_tiles(512, torch.float32, True, 64) == AttentionTiles(64, 16, 8, 1)
    # a head_dim that pads to 512 takes its shapes
    assert prefill_tiles(320, torch.bfloat16) == prefill_tiles(512, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quantized", [False, True])
def test_head_dim_512_prefill_fits_the_budgets(dtype, quantized):
    tiles = prefill_tiles(512, dtype)
    assert shared_memory_bytes(tiles, 512, dtype, quantized) <= SHARED_MEMORY_BUDGET
    assert accumulator_registers(tiles, 512) <= ACCUMULATOR_REGISTERS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quantized", [False, True])
def test_head_dim_512_decode_fits_the_budgets(dtype, quantized):
    # rows: one query of GQA groups up to 16, and verify steps of up to 8 queries of a group of 8
    for rows in [1, 2, 8, 16, 17, 32, 40, 64]:
        tiles = decode_tiles(512, dtype, quantized, rows)
        assert shared_memory_bytes(tiles, 512, dtype, quantized) <= SHARED_MEMORY_BUDGET
        assert accumulator_registers(tiles, 512) <= ACCUMULATOR_REGISTERS


def test_the_estimate_of_the_bf16_prefill_tile_at_512():
    # 64 KB of q, 64 KB of K and V operands, 64 KB loading ahead; an FP8 cache loads half the bytes ahead
    assert shared_memory_bytes(prefill_tiles(512, torch.bfloat16), 512, torch.bfloat16, False) == 192 * KB
    assert shared_memory_bytes(prefill_tiles(512, torch.bfloat16), 512, torch.bfloat16, True) == 160 * KB


def test_too_wide_heads_and_too_many_rows_are_refused():
    with pytest.raises(ValueError, match="head_dim up to 512"):
        prefill_tiles(576, torch.bfloat16)
    with pytest.raises(ValueError, match="head_dim up to 512"):
        decode_tiles(1024, torch.bfloat16, False, 8)
    with pytest.raises(ValueError, match="at most 64 query rows per KV head, not 65"):
        decode_tiles(512, torch.bfloat16, False, 65)
    with pytest.raises(ValueError, match="query rows"):
        decode_tiles(512, torch.float32, True, 128)
