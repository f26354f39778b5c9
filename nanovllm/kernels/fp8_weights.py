"""FP8 linear weights' number format and product, in plain PyTorch: the CPU path and the reference a GPU
kernel must match.

A weight [N, K] is stored as float8_e4m3fn values and one fp32 scale per block of `block` = (rows,
columns) of it: scales [ceil(N / rows), ceil(K / columns)], each amax(|block|) / 448 (1 for an all-zero
block), so a block's largest value maps to e4m3's largest finite one. Two layouts use it:

- per output channel, block (1, K): scales [N, 1] (what `quantization="fp8"` makes at load, and what a
  compressed-tensors checkpoint holds per channel or, broadcast to every row, per tensor);
- 128 x 128 blocks (block-FP8 checkpoints: Qwen3-*-FP8, DeepSeek): scales [ceil(N/128), ceil(K/128)],
  which the checkpoint calls `weight_scale_inv` (the multiplier that dequantizes).

Activations of products of several rows are quantized on the fly per token and per group of the weight
block's width (the whole row for per-channel weights, groups of 128 for block weights, as vLLM does), so
that each product of a block of x and a block of W carries one scale of each and runs on FP8 tensor
cores. One row, and a few rows (up to 16: a decode step of a few sequences, a verify step) of
per-channel weights, are multiplied unquantized, as the GEMV (`triton_gemv.py`) does:
`quantize_x=False`; its rows kernel quantizes a few rows of block weights like the larger products.
"""

import torch

from nanovllm.kernels.fp8_kv import FP8_DTYPE, FP8_MAX


def _blocked(t: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """`t` zero-padded to whole blocks and viewed block by block."""
    # t: [N, K] -> [N / rows, rows, K / columns, columns] (sizes rounded up)
    rows, columns = block
    n, k = t.shape
    padded = torch.nn.functional.pad(t, (0, -k % columns, 0, -n % rows))
    return padded.view(padded.size(0) // rows, rows, padded.size(1) // columns, columns)


def _expanded(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Each block's scale repeated over the block's entries, cropped to `shape`."""
    # scale: [N / rows, K / columns] -> [N, K]
    rows, columns = block
    n_blocks, k_blocks = scale.shape
    full = scale[:, None, :, None].expand(n_blocks, rows, k_blocks, columns).reshape(n_blocks * rows, -1)
    return full[: shape[0], : shape[1]]


def block_amax(t: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The largest magnitude of each block of `t`, in fp32."""
    # t: [N, K] -> [ceil(N / rows), ceil(K / columns)]
    return _blocked(t.float(), block).abs().amax(dim=(1, 3))


def scales_of(amax: torch.Tensor) -> torch.Tensor:
    """The dequantization scale of blocks whose largest magnitudes are `amax`: amax / 448, 1 where 0."""
    return torch.where(amax > 0, amax / FP8_MAX, 1.0)


def quantize_with(t: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """`t` divided by its blocks' `scale`, as float8."""
    # t: [N, K]; scale: [ceil(N / rows), ceil(K / columns)] -> [N, K] fp8
    return (t.float() / _expanded(scale, block, t.shape)).to(FP8_DTYPE)


def quantize_blocks(t: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` as float8 values and one fp32 scale per block."""
    # t: [N, K] -> [N, K] fp8, scales [ceil(N / rows), ceil(K / columns)] fp32
    scale = scales_of(block_amax(t, block))
    return quantize_with(t, scale, block), scale


def quantize_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` as float8 values and one fp32 scale per row (per output channel of a weight, per token of x)."""
    # t: [N, K] -> [N, K] fp8, scales [N, 1] fp32
    return quantize_blocks(t, (1, t.size(1)))


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float8 values times their blocks' scales, in fp32."""
    # q: [N, K] fp8; scale: [ceil(N / rows), ceil(K / columns)] -> [N, K] fp32
    return q.float() * _expanded(scale, block, q.shape)


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    quantize_x: bool = True,
) -> torch.Tensor:
    """x W^T (+ b) with W in FP8: x quantized per token and group of `block[1]` columns (unless not
    `quantize_x`), then both dequantized and multiplied in fp32 (where a kernel accumulates the FP8
    products), the bias added, and the sum rounded once to x's dtype.

    x: [tokens, K]; weight: [N, K] fp8; weight_scale: [ceil(N / block[0]), ceil(K / block[1])] fp32;
    bias: [N] -> [tokens, N] in x's dtype
    """
    x_values = x.float()
    if quantize_x:
        group = (1, block[1])
        x_values, x_scale = quantize_blocks(x, group)  # [tokens, K] fp8, [tokens, ceil(K / block[1])]
        x_values = dequantize_blocks(x_values, x_scale, group)
    product = x_values @ dequantize_blocks(weight, weight_scale, block).T
    if bias is not None:
        product += bias.float()
    return product.to(x.dtype)


def dequantize_to(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    """float8 values times their blocks' scales, in fp32, rounded once to `dtype`; the weight's sizes must be
    whole blocks."""
    # q: [N, K] fp8; scale: [N / rows, K / columns] -> [N, K] in dtype
    rows, columns = block
    blocks = q.view(q.size(0) // rows, rows, q.size(1) // columns, columns)
    return (blocks.float() * scale[:, None, :, None]).to(dtype).view(q.shape)
