"""Triton helpers: MXFP4 weights (`kernels/mxfp4.py` has the format) dequantized in registers, for the fused
MoE kernels that read them (`triton_moe.py`, `triton_moe_gemv.py`).

- `dequantize_pairs`: a chunk of bytes and the scales of their blocks (one scale per 16 bytes, broadcast
  over them) give two fp32 tensors of the chunk's shape: the bytes' even elements (their low nibbles) and
  their odd ones (high nibbles). Rather than interleave them back into one row, the few-token kernels pair
  them with the even and the odd inputs (x[2b] and x[2b + 1]), which sums the same products in another
  order.
- `scaled_dot`: a tile of rows times a tile of MXFP4 columns, for the grouped GEMMs. On a GPU, Triton's
  `tl.dot_scaled` upcasts the bytes as it feeds the tensor cores: 4.3x faster than dequantizing the tile
  in registers first and multiplying with `tl.dot` (gpt-oss-20b's gate/up at 256 tokens, docs/benchmarks.md),
  since the dequantized tile no longer goes through a change of register layout. Triton's interpreter has
  no `tl.dot_scaled`; there (and for fp32 rows, which it does not take) the tile is dequantized and
  interleaved into its [K, N] order, which multiplies to the same sums.
"""

import triton
import triton.language as tl


@triton.jit
def _e2m1_times_2_to_minus_14(nibbles):
    """Each e2m1 nibble (int16, 0 to 15) as the fp16 whose sign is the nibble's top bit and whose exponent
    and mantissa fields' low bits are its other three: 2^-14 times the nibble's value, exactly (exponent 0
    is fp16's subnormal range, as it is e2m1's), from two masks, two shifts and an or."""
    return (((nibbles & 8) << 12) | ((nibbles & 7) << 9)).to(tl.float16, bitcast=True)


@triton.jit
def dequantize_pairs(packed, scales):
    """The even and the odd elements (fp32) of MXFP4 bytes `packed` whose blocks' e8m0 bytes are `scales`
    (uint8, of a shape that broadcasts to packed's; a scale of 0 gives 0 rather than 2^-127)."""
    # 2^(s - 127) is the fp32 whose exponent field is s; 2^14 undoes the nibbles' fp16 offset
    scale = (scales.to(tl.int32) << 23).to(tl.float32, bitcast=True) * 16384.0
    values = packed.to(tl.int16)
    even = _e2m1_times_2_to_minus_14(values & 15).to(tl.float32) * scale
    odd = _e2m1_times_2_to_minus_14((values >> 4) & 15).to(tl.float32) * scale
    return even, odd


@triton.jit
def scaled_dot(a, packed, scales, acc, NATIVE: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a . w for the MXFP4 columns w whose bytes are `packed` [BLOCK_K / 2, BLOCK_N] (byte b of a
    column holds its elements 2b and 2b + 1) and whose blocks' scales are `scales` [BLOCK_N, BLOCK_K / 32];
    a: [BLOCK_M, BLOCK_K], acc: [BLOCK_M, BLOCK_N] fp32. NATIVE (bf16 rows on a GPU): through
    `tl.dot_scaled`."""
    if NATIVE:
        return tl.dot_scaled(a, None, "bf16", packed, scales, "e2m1", acc)
    half_k: tl.constexpr = packed.shape[0]
    block_n: tl.constexpr = packed.shape[1]
    groups = tl.reshape(packed, (half_k // 16, 16, block_n))
    block_scales = tl.reshape(tl.trans(scales), (half_k // 16, 1, block_n))
    even, odd = dequantize_pairs(groups, block_scales)  # [BLOCK_K / 32, 16, BLOCK_N] each
    w = tl.reshape(tl.permute(tl.join(even, odd), (0, 1, 3, 2)), (2 * half_k, block_n))  # [BLOCK_K, BLOCK_N]
    return tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
