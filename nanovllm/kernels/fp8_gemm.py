"""FP8 products of several rows on a GPU's FP8 tensor cores: x quantized on the fly, then one
`torch._scaled_mm` (cuBLASLt) that multiplies the two float8 operands, accumulates in fp32 and applies
both operands' scales before rounding once.

- Per-channel weights (`scaled_mm_linear`): x quantized per token; cuBLASLt applies x's scale per token
  and W's per output channel, and adds the bias.
- 128 x 128 block weights (`block_scaled_mm_linear`, Hopper): x quantized per token and group of 128
  columns; cuBLASLt applies one scale of each operand per 128 columns of the sum, as DeepSeek's recipe does.

The arithmetic is `fp8_weights.fp8_linear`'s, up to the order of the fp32 sums. Other layouts and fp32
models take that PyTorch reference instead (cuBLASLt's scaling writes 16-bit outputs only).
"""

import functools

import torch

from nanovllm.kernels.fp8_kv import FP8_DTYPE
from nanovllm.kernels.fp8_weights import quantize_rows, scales_of

# the amax, the division and the cast to float8 in one generated kernel
_quantize_rows = torch.compile(quantize_rows, dynamic=True)
# cuBLASLt's 1 x 128 scaling reads x's scales column by column, each column's start 16-byte aligned:
# x is padded to a multiple of 4 rows
_SCALE_ROWS_ALIGN = 4
BLOCK = (128, 128)


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


def _quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x as float8 values and one fp32 scale per token and group of 128 columns (`quantize_blocks`'
    arithmetic on whole groups)."""
    # x: [tokens, K] -> [tokens, K] fp8, [tokens, K / 128] fp32
    tokens, k = x.shape
    groups = x.float().view(tokens, k // BLOCK[1], BLOCK[1])
    scale = scales_of(groups.abs().amax(dim=-1))
    return (groups / scale[..., None]).to(FP8_DTYPE).view(tokens, k), scale


# the amax, the division and the cast to float8 in one generated kernel
_quantize_groups_compiled = torch.compile(_quantize_groups, dynamic=True)


def _quantized_x(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x padded with zero rows to a multiple of 4, quantized per token and group of 128 columns, its scales
    column-major (the layout cuBLASLt's 1 x 128 scaling reads)."""
    # x: [tokens, K] -> [padded, K] fp8, [padded, K / 128] fp32 with strides (1, padded)
    if x.size(0) % _SCALE_ROWS_ALIGN:
        x = torch.nn.functional.pad(x, (0, 0, 0, -x.size(0) % _SCALE_ROWS_ALIGN))
    values, scale = _quantize_groups_compiled(x)
    return values, scale.t().contiguous().t()


@functools.cache
def _is_hopper(device: torch.device) -> bool:
    """Whether `device` is a Hopper GPU (asked once per device: the products ask every step)."""
    return torch.cuda.get_device_capability(device)[0] == 9


def takes_block_scaled_mm(weight: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether cuBLASLt multiplies by this FP8 weight with its block scales: Hopper, 128 x 128 blocks, whole
    blocks of rows, and whole groups of 4 blocks of columns (the row stride of the scales that every
    version of its scaling takes)."""
    n, k = weight.shape
    return (
        weight.is_cuda
        and _is_hopper(weight.device)
        and block == BLOCK
        and n % BLOCK[0] == 0
        and k % (4 * BLOCK[1]) == 0
    )


def block_scaled_mm_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x W^T (+ b) for W float8 in 128 x 128 blocks (`takes_block_scaled_mm`), x bf16 or fp16 quantized per
    token and group of 128 columns.

    x: [tokens, K]; weight: [N, K] fp8; weight_scale: [N / 128, K / 128] fp32; bias: [N] -> [tokens, N]
    """
    x_values, x_scale = _quantized_x(x)  # [padded, K] fp8, [padded, K / 128] fp32
    # W^T: a column-major view of the row-major weight; its scales [K / 128, N / 128] likewise
    out = torch._scaled_mm(x_values, weight.t(), scale_a=x_scale, scale_b=weight_scale.t(), out_dtype=x.dtype)
    out = out[: x.size(0)]
    return out if bias is None else out + bias
