"""The FP8 KV cache's number format, in plain PyTorch: the CPU path and the reference for the Triton kernels.

Each head of each token is stored as head_dim float8_e4m3fn values and one
fp32 scale, amax(|x|) / 448, so the largest value of the head maps to e4m3's
largest finite value (448) and each value keeps a 3-bit mantissa relative to
its own head's range. A per-block scale would have to be known before the
block's later tokens exist; per token and head, the store needs nothing but
the head it writes. The scales cost 4 bytes per 128 cached values (head_dim
128), so a cache of 132 bytes per head and token holds 1.94x the tokens of a
bf16 one.

Scale layout: [num_blocks, kv_heads, block_size] fp32, so that a tile of
consecutive positions of one head reads one contiguous run of scales.
"""

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3fn's largest finite value
SCALE_DTYPE = torch.float32


def quantize_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head of `x` as float8 values and the fp32 scale that restores them (1 for an all-zero head)."""
    # x: [tokens, kv_heads, head_dim] -> [tokens, kv_heads, head_dim] fp8, scales [tokens, kv_heads]
    amax = x.float().abs().amax(-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, 1.0)
    return (x.float() / scale.unsqueeze(-1)).to(FP8_DTYPE), scale.to(SCALE_DTYPE)


def dequantize_heads(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float8 heads times their scales, in `dtype`."""
    # x: [..., head_dim] fp8; scale: [...] -> [..., head_dim]
    return (x.float() * scale.unsqueeze(-1)).to(dtype)


def round_trip(x: torch.Tensor) -> torch.Tensor:
    """`x` as the FP8 cache gives it back: what attention over the cache reads for these keys or values."""
    return dequantize_heads(*quantize_heads(x), x.dtype)


def quantize_paged_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole full-precision paged cache as FP8 values and their scales."""
    # cache: [num_blocks, block_size, kv_heads, d] -> same shape fp8, scales [num_blocks, kv_heads, block_size]
    values, scales = quantize_heads(cache.flatten(0, 1))
    return values.view(cache.shape), scales.view(cache.shape[:3]).transpose(1, 2).contiguous()
