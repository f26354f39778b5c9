"""MXFP4 weights (OCP microscaling, as gpt-oss's checkpoints store their experts), in plain PyTorch: the CPU
path and the reference the Triton kernels must match.

A weight [N, K] is stored along its input dimension K in blocks of BLOCK = 32 values that share one scale:
- values: FP4 e2m1 (a sign bit, two exponent bits, one mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6),
  two a byte, element 2j in the low nibble of byte j and element 2j + 1 in its high nibble: packed
  [N, K / 2] uint8;
- scales: e8m0, a byte s each meaning 2^(s - 127): scales [N, K / 32] uint8.
4.25 bits a weight. The values and scales are exact in bf16 (but for scales below 2^-126), so dequantizing
to the model's dtype loses nothing.
"""

import torch

BLOCK = 32  # values that share a scale
_SCALE_BIAS = 127  # e8m0's exponent bias
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = _E2M1_MAGNITUDES[-1]
# the value of each nibble: the sign is its top bit
E2M1_VALUES = _E2M1_MAGNITUDES + tuple(-m for m in _E2M1_MAGNITUDES)


def dequantize(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weights that `packed` values and their block `scales` stand for, in `dtype`.

    packed: [..., K / 2] uint8; scales: [..., K / 32] uint8 -> [..., K]
    """
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    pairs = torch.stack([table[(packed & 0xF).long()], table[(packed >> 4).long()]], dim=-1)  # [..., K / 2, 2]
    blocks = pairs.view(*packed.shape[:-1], scales.size(-1), BLOCK)  # [..., K / 32, 32]
    scaled = torch.ldexp(blocks, scales.to(torch.int32)[..., None] - _SCALE_BIAS)
    return scaled.flatten(-2).to(dtype)


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`w`'s nearest MXFP4 values: each block scaled by the least power of two that brings its largest
    magnitude within e2m1's 6, each value rounded to the nearest e2m1 value (for tests and made-up weights).

    w: [..., K] (K a multiple of 32) -> packed [..., K / 2] uint8, scales [..., K / 32] uint8
    """
    if w.size(-1) % BLOCK:
        raise ValueError(f"MXFP4 weights need an input size that is a multiple of {BLOCK}, got {w.size(-1)}")
    blocks = w.float().contiguous().unflatten(-1, (-1, BLOCK))  # [..., K / 32, 32]
    amax = blocks.abs().amax(dim=-1)
    exponent = torch.ceil(torch.log2(amax / E2M1_MAX)).nan_to_num(0.0, neginf=0.0).clamp(-_SCALE_BIAS, _SCALE_BIAS)
    scaled = torch.ldexp(blocks, -exponent[..., None].int()).flatten(-2)  # [..., K], |scaled| <= 6
    # the nearest magnitude: how many of the midpoints between e2m1's magnitudes lie below
    magnitudes = torch.tensor(_E2M1_MAGNITUDES, device=w.device)
    nearest = torch.bucketize(scaled.abs(), (magnitudes[1:] + magnitudes[:-1]) / 2).to(torch.uint8)
    nibbles = nearest | ((scaled < 0).to(torch.uint8) << 3)  # [..., K]
    packed = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return packed, (exponent + _SCALE_BIAS).to(torch.uint8)
