"""Triton helpers: MXFP4 weights (`kernels/mxfp4.py` has the format) dequantized in registers, for the fused
MoE kernels that read them (`triton_moe.py`, `triton_moe_gemv.py`).

A kernel loads a chunk of bytes and, for each, the scale of its block (byte b of a row is in block b // 16),
and gets two fp32 tensors of the chunk's shape: the bytes' even elements (their low nibbles) and their odd
ones (high nibbles). Rather than interleave them back into one row, the kernel pairs them with the even and
the odd inputs (x[2b] and x[2b + 1]), which sums the same products in another order.
"""

import triton
import triton.language as tl


@triton.jit
def _e2m1(nibbles):
    """The fp32 value of each e2m1 nibble (int32, 0 to 15): a sign bit, two exponent bits e, a mantissa bit m;
    0.5 * m where e is 0, else 2^(e - 1) * (1 + m / 2), which is (2 + m) * 2^e / 4."""
    exponent = (nibbles >> 1) & 3
    mantissa = (nibbles & 1).to(tl.float32)
    power = (1 << exponent).to(tl.float32)
    magnitude = tl.where(exponent == 0, 0.5 * mantissa, (2.0 + mantissa) * power * 0.25)
    return tl.where(nibbles >= 8, -magnitude, magnitude)


@triton.jit
def dequantize_pairs(packed, scales):
    """The even and the odd elements (fp32) of MXFP4 bytes `packed` whose blocks' e8m0 bytes are `scales`
    (both uint8, of one shape; a scale of 0 gives 0 rather than 2^-127)."""
    # 2^(s - 127) is the fp32 whose exponent field is s
    scale = (scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    values = packed.to(tl.int32)
    return _e2m1(values & 15) * scale, _e2m1(values >> 4) * scale
