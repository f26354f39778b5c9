"""FP8 products of several rows on a GPU's FP8 tensor cores: x quantized per token, then one
`torch._scaled_mm` (cuBLASLt) that multiplies the two float8 operands, accumulates in fp32 and applies
both row-wise scales (x's per token, W's per output channel) and the bias before rounding once.

The arithmetic is `fp8_weights.fp8_linear`'s for per-channel weights, up to the order of the fp32 sums.
Block-scaled weights and fp32 models take that PyTorch reference instead (cuBLASLt's row-wise scaling
writes 16-bit outputs only).
"""

import torch

from nanovllm.kernels.fp8_weights import quantize_rows

# the amax, the division and the cast to float8 in one generated kernel
_quantize_rows = torch.compile(quantize_rows, dynamic=True)


def scaled_mm_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x W^T (+ b) for W float8 with one scale per output channel, x bf16 or fp16 quantized per token.

    x: [tokens, K]; weight: [N, K] fp8; weight_scale: [N, 1] fp32; bias: [N] -> [tokens, N] in x's dtype
    """
    x_values, x_scale = _quantize_rows(x)  # [tokens, K] fp8, [tokens, 1] fp32
    # W^T is a column-major view of the row-major weight, the layout cuBLASLt's FP8 kernels take
    return torch._scaled_mm(
        x_values, weight.t(), scale_a=x_scale, scale_b=weight_scale.t(), bias=bias, out_dtype=x.dtype
    )
