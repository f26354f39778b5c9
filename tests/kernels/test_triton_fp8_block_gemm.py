"""The block-FP8 product of many rows (`triton_fp8_block_gemm`) against its PyTorch reference,
`fp8_weights.fp8_linear` with x quantized per token and group of 128 columns: the quantization bit for bit,
the product up to the order of its fp32 sums; on the CPU under the Triton interpreter on small shapes, on a
GPU also at prefill sizes and in a CUDA graph. The FP8 layer sends many rows to it on a GPU only."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels import triton_fp8_block_gemm  # noqa: E402
from nanovllm.kernels.fp8_weights import fp8_linear, quantize_blocks  # noqa: E402
from nanovllm.kernels.triton_fp8_block_gemm import (  # noqa: E402
    BLOCK,
    block_fp8_gemm,
    block_fp8_linear,
    quantize_groups,
)
from nanovllm.layers.fp8_linear import quantize_weights  # noqa: E402
from nanovllm.layers.linear import GEMV_MAX_ROWS, ColumnParallelLinear  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
FP8_GPU = ON_GPU and torch.cuda.get_device_capability() >= (8, 9)
needs_fp8 = pytest.mark.skipif(ON_GPU and not FP8_GPU, reason="FP8 tensor cores need compute capability 8.9")
# Both sides multiply the same float8 values with the same scales and sum in fp32, in another order: the
# sums agree to ~1e-6 relative (on Hopper ~1e-4: its FP8 MMA sums each 128-column step with about 14 bits
# of mantissa), so a 16-bit output is the same value or one rounding step (2^-8 relative in bf16) apart;
# 1e-2 leaves room for that step and no more. fp32 outputs show only the order and precision of the sums.
TOLERANCE = {torch.float32: 1e-3 if ON_GPU else 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def fp8_weight(features: int, inputs: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random weight as FP8 values and its 128 x 128 block scales."""
    torch.manual_seed(seed)
    return quantize_blocks(torch.randn(features, inputs, device=DEVICE) / inputs**0.5, BLOCK)


def activations(rows: int, inputs: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """Rows whose magnitudes differ from token to token and from one group of columns to the next."""
    torch.manual_seed(seed)
    x = torch.randn(rows, inputs, device=DEVICE)
    token_scale = torch.logspace(-3, 3, rows, base=2, device=DEVICE)[:, None]
    group_scale = torch.logspace(-2, 2, -(-inputs // 128), base=2, device=DEVICE).repeat_interleave(128)[:inputs]
    return (x * token_scale * group_scale).to(dtype)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=TOLERANCE[want.dtype], rtol=TOLERANCE[want.dtype])


def assert_same_fp8(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal bit for bit (float8 has no equality in PyTorch; -0.0 and 0.0 count as different)."""
    assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@needs_fp8
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 128), (5, 320), (33, 256), (3, 40)], ids=str)
def test_quantize_groups_is_the_reference_quantization(shape, dtype):
    x = activations(*shape, dtype)
    x[0, : min(128, shape[1])] = 0.0  # an all-zero group: scale 1
    values, scale = quantize_groups(x)
    want_values, want_scale = quantize_blocks(x, (1, 128))
    assert_same_fp8(values, want_values)
    assert scale.shape == want_scale.shape and torch.equal(scale, want_scale)


# (value, its float8 value) with scale 1: ties between float8 neighbours round to the even one, in e4m3's
# subnormal range (2^-9 apart), in its normal binades and where rounding carries into the next binade
TIES = [
    (84.0, 80.0),
    (92.0, 96.0),
    (17.0, 16.0),
    (19.0, 20.0),
    (248.0, 256.0),
    (-84.0, -80.0),
    (2.0**-10, 0.0),
    (3 * 2.0**-10, 2.0**-8),
    (5 * 2.0**-10, 2.0**-8),
]


@needs_fp8
def test_quantize_groups_rounds_ties_to_even_and_keeps_signed_zeros():
    values = [448.0, *(value for value, _ in TIES), -0.0, -(2.0**-20)]  # amax 448: scale 1
    x = torch.nn.functional.pad(torch.tensor(values), (0, 128 - len(values))).to(DEVICE, torch.bfloat16)[None]
    got, scale = quantize_groups(x)
    assert scale.item() == 1.0
    assert_same_fp8(got, quantize_blocks(x, (1, 128))[0])
    assert got[0, 1 : len(TIES) + 1].float().tolist() == [rounded for _, rounded in TIES]
    # -0.0 and a negative value that rounds to zero keep their sign, as PyTorch's cast does
    assert got[0, len(TIES) + 1 : len(TIES) + 3].view(torch.uint8).tolist() == [0x80, 0x80]


@needs_fp8
def test_quantize_groups_reads_rows_that_lie_apart():
    x = activations(6, 2 * 300, torch.bfloat16)[:, :300]  # each row 600 values after the one before
    values, scale = quantize_groups(x)
    want_values, want_scale = quantize_blocks(x, (1, 128))
    assert_same_fp8(values, want_values)
    assert torch.equal(scale, want_scale)


@needs_fp8
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("inputs", [128, 256 + 64], ids=lambda k: f"K{k}")
@pytest.mark.parametrize("features", [128, 200], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("rows", [1, 5, 33], ids=lambda m: f"M{m}")
def test_product_is_the_reference_with_x_quantized_per_group(rows, features, inputs, dtype):
    weight, weight_scale = fp8_weight(features, inputs)
    x = activations(rows, inputs, dtype)
    bias = torch.randn(features, device=DEVICE, dtype=dtype)
    assert_close(block_fp8_linear(x, weight, weight_scale), fp8_linear(x, weight, weight_scale, BLOCK))
    assert_close(block_fp8_linear(x, weight, weight_scale, bias), fp8_linear(x, weight, weight_scale, BLOCK, bias))


@needs_fp8
@pytest.mark.parametrize("tile", [(16, 32), (16, 256)], ids=["BN32", "BN256"])
def test_tiles_of_any_size_in_grouped_order_cover_every_output(tile, monkeypatch):
    # 5 row tiles in groups of 2 (the last group short) and partial column tiles; 256-wide column tiles
    # span two blocks of W's rows, 32-wide ones a quarter of one
    monkeypatch.setattr(triton_fp8_block_gemm, "GEMM_BLOCKS", ((None, (*tile, 2, 4)),))
    monkeypatch.setattr(triton_fp8_block_gemm, "GROUP_M", 2)
    weight, weight_scale = fp8_weight(300, 200)
    x = activations(70, 200, torch.float32)
    assert_close(block_fp8_linear(x, weight, weight_scale), fp8_linear(x, weight, weight_scale, BLOCK))


@needs_fp8
def test_product_takes_scales_in_either_layout_and_writes_the_asked_dtype():
    weight, weight_scale = fp8_weight(200, 320)
    x = activations(9, 320, torch.bfloat16)
    values, scale = quantize_groups(x)
    want = fp8_linear(x.float(), weight, weight_scale, BLOCK)
    for x_scale in (scale, scale.contiguous()):  # column-major as quantized, and row-major
        assert_close(block_fp8_gemm(values, x_scale, weight, weight_scale, out_dtype=torch.float32), want)
    assert block_fp8_gemm(values[:0], scale[:0], weight, weight_scale).shape == (0, 200)


def block_fp8_layer(inputs: int, features: int, dtype: torch.dtype) -> ColumnParallelLinear:
    """A projection whose bf16 weight is quantized to FP8 with 128 x 128 block scales, as a block-FP8
    checkpoint holds it."""
    torch.manual_seed(2)
    layer = ColumnParallelLinear(inputs, features, bias=True).to(DEVICE)
    layer.weight.data = torch.randn(features, inputs, device=DEVICE, dtype=dtype) / inputs**0.5
    layer.bias.data = torch.randn(features, device=DEVICE, dtype=dtype)
    quantize_weights(layer, BLOCK)
    return layer


def test_fp8_layer_on_the_cpu_takes_the_reference(monkeypatch):
    def not_on_the_cpu(*args, **kwargs):
        raise AssertionError("the CPU takes the PyTorch reference")

    monkeypatch.setattr(triton_fp8_block_gemm, "block_fp8_linear", not_on_the_cpu)
    layer = block_fp8_layer(320, 200, torch.bfloat16).cpu()
    for rows in (GEMV_MAX_ROWS, GEMV_MAX_ROWS + 17):
        x = activations(rows, 320, torch.bfloat16).cpu()
        want = fp8_linear(x, layer.weight, layer.weight_scale, BLOCK, layer.bias, quantize_x=rows > GEMV_MAX_ROWS)
        assert torch.equal(layer(x), want)


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
def test_fp8_layer_on_a_gpu_sends_many_rows_to_the_block_product(monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].size(0))
        return block_fp8_linear(*args, **kwargs)

    monkeypatch.setattr(triton_fp8_block_gemm, "block_fp8_linear", counted)
    layer = block_fp8_layer(4096, 6144, torch.bfloat16)
    for rows in (GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1, 512):
        x = activations(rows, 4096, torch.bfloat16)
        quantize_x = rows > GEMV_MAX_ROWS
        assert_close(layer(x), fp8_linear(x, layer.weight, layer.weight_scale, BLOCK, layer.bias, quantize_x))
    assert calls == [GEMV_MAX_ROWS + 1, 512]  # the GEMV keeps the few rows


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape",
    # (rows, features, inputs): a prefill of 4096 tokens; Qwen3-8B's qkv and down at a few sizes of the
    # three tile choices; partial blocks of rows and columns
    [(4096, 4096, 4096), (17, 6144, 4096), (200, 4096, 12288), (1000, 6144, 4096), (300, 4096 + 64, 4096 + 64)],
    ids=str,
)
def test_prefill_sizes_on_a_gpu(shape, dtype):
    rows, features, inputs = shape
    weight, weight_scale = fp8_weight(features, inputs)
    x = activations(rows, inputs, dtype)
    bias = torch.randn(features, device=DEVICE, dtype=dtype)
    values, scale = quantize_groups(x)
    want_values, want_scale = quantize_blocks(x, (1, 128))
    assert_same_fp8(values, want_values)
    assert torch.equal(scale, want_scale)
    assert_close(block_fp8_linear(x, weight, weight_scale, bias), fp8_linear(x, weight, weight_scale, BLOCK, bias))


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
def test_replayed_in_a_cuda_graph_quantizes_new_inputs():
    weight, weight_scale = fp8_weight(4096, 4096)
    x = activations(256, 4096, torch.bfloat16)
    block_fp8_linear(x, weight, weight_scale)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = block_fp8_linear(x, weight, weight_scale)
    for seed in range(2):
        x.copy_(activations(256, 4096, torch.bfloat16, seed=10 + seed))
        graph.replay()
        assert_close(got, fp8_linear(x, weight, weight_scale, BLOCK))
