"""The FP8 weight format and product against a float64 dequantize-and-multiply."""

import pytest
import torch

from nanovllm.kernels.fp8_kv import FP8_DTYPE, FP8_MAX
from nanovllm.kernels.fp8_weights import dequantize_blocks, dequantize_to, fp8_linear, quantize_blocks, quantize_rows

# e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself; below 2^-6 (times the scale)
# the spacing is 2^-9, so a subnormal rounds within 2^-10
_RELATIVE, _SUBNORMAL = 2.0**-4, 2.0**-10


def test_quantize_rows_round_trips_within_e4m3_rounding():
    torch.manual_seed(0)
    t = torch.randn(48, 96) * torch.logspace(-3, 2, 48).unsqueeze(1)  # rows of very different ranges
    t[5] = 0.0
    values, scale = quantize_rows(t)
    assert values.dtype == FP8_DTYPE and scale.shape == (48, 1) and scale.dtype == torch.float32
    assert scale[5].item() == 1.0 and not values[5].float().any()  # an all-zero row keeps scale 1
    # each row's largest magnitude maps to e4m3's largest finite value
    assert torch.equal(values.float().abs().amax(1)[t.abs().amax(1) > 0], torch.full((47,), FP8_MAX))
    error = (dequantize_blocks(values, scale, (1, 96)) - t).abs()
    assert (error <= t.abs() * _RELATIVE + scale * _SUBNORMAL).all()


def test_block_scales_cover_partial_blocks():
    t = torch.randn(300, 200)
    values, scale = quantize_blocks(t, (128, 128))
    assert scale.shape == (3, 2)
    assert scale[2, 1] == t[256:, 128:].abs().amax() / FP8_MAX  # the corner block's own range
    error = (dequantize_blocks(values, scale, (128, 128)) - t).abs()
    assert (error <= t.abs() * _RELATIVE + _SUBNORMAL * scale.amax()).all()


def float64_reference(x, weight, weight_scale, block, bias):
    """x quantized as fp8_linear quantizes it, then both operands dequantized and multiplied in float64."""
    group = (1, block[1])
    x_values, x_scale = quantize_blocks(x, group)

    def dequantized(values, scale, block):
        rows, columns = block
        full = scale.double().repeat_interleave(rows, 0).repeat_interleave(columns, 1)
        return values.double() * full[: values.size(0), : values.size(1)]

    y = dequantized(x_values, x_scale, group) @ dequantized(weight, weight_scale, block).T
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("block", [None, (128, 128), (32, 64)], ids=["per-channel", "128x128", "32x64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear_is_the_dequantized_product(block, dtype, with_bias):
    torch.manual_seed(1)
    x = torch.randn(7, 320).to(dtype)
    weight = torch.randn(200, 320) * 0.05
    block = (1, 320) if block is None else block
    values, scale = quantize_blocks(weight, block)
    bias = torch.randn(200).to(dtype) if with_bias else None
    y = fp8_linear(x, values, scale, block, bias)
    expected = float64_reference(x, values, scale, block, bias)
    assert y.dtype == dtype and y.shape == (7, 200)
    # fp32 accumulation (about 1e-6 relative over 320 terms), then one rounding to the output dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2.0**-8
    assert torch.allclose(y.double(), expected, rtol=tolerance, atol=tolerance * expected.abs().amax().item() / 10)


def test_fp8_linear_is_near_the_full_precision_product():
    torch.manual_seed(2)
    x, weight = torch.randn(16, 256), torch.randn(64, 256) * 0.05
    exact = x @ weight.T
    for block in ((1, 256), (128, 128)):
        y = fp8_linear(x, *quantize_blocks(weight, block), block)
        assert (y - exact).norm() / exact.norm() < 0.04  # two e4m3 roundings of about 2% each


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_of_whole_blocks_dequantizes_to_a_dtype_rounded_once(dtype):
    torch.manual_seed(2)
    values, scale = quantize_blocks(torch.randn(256, 384), (128, 128))
    assert torch.equal(
        dequantize_to(values, scale, (128, 128), dtype), dequantize_blocks(values, scale, (128, 128)).to(dtype)
    )
