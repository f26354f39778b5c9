"""The FP8-weight products against their PyTorch reference (`fp8_weights.fp8_linear`): the one-row GEMV
(plain, with the RMSNorm or the gated activation in front, per-channel and 128 x 128 block scales) under
the Triton interpreter on small shapes and compiled on a GPU on the Qwen3-8B projections, eager and in a
graph; on a GPU also the row-wise scaled product of several rows (`fp8_gemm.scaled_mm_linear`), and a layer's
product of several rows with block scales (on Hopper by cuBLASLt's block scaling, x quantized per 128 columns;
where that does not take the weight, by the weight dequantized to 16 bits)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.fp8_gemm import scaled_mm_linear, takes_block_scaled_mm  # noqa: E402
from nanovllm.kernels.fp8_weights import fp8_linear, quantize_blocks  # noqa: E402
from nanovllm.kernels.triton_gemv import gated_gemv, gemv, rms_norm_gemv  # noqa: E402
from nanovllm.layers.layernorm import rms_norm  # noqa: E402
from nanovllm.layers.linear import ReplicatedLinear  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
FP8_GPU = ON_GPU and torch.cuda.get_device_capability() >= (8, 9)
HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9
# (features, inputs): the Qwen3-8B projections (qkv, o, gate_up, down) on a GPU; small uneven ones on the CPU
SHAPES = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)] if ON_GPU else [(40, 70), (136, 300)]
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
BLOCKS = {"per-channel": None, "128x128": (128, 128)}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def fp8_weight(features: int, inputs: int, block, seed: int = 0):
    """A random weight as FP8 values, its scales and the block they cover."""
    torch.manual_seed(seed)
    weight = torch.randn(features, inputs, device=DEVICE) / inputs**0.5
    block = (1, inputs) if block is None else block
    values, scale = quantize_blocks(weight, block)
    return values, scale, block


def reference(x: torch.Tensor, values, scale, block, bias=None) -> torch.Tensor:
    return fp8_linear(x, values, scale, block, bias, quantize_x=False)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    tolerance = TOLERANCE[want.dtype]
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(ON_GPU and not FP8_GPU, reason="FP8 weights need compute capability 8.9")
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gemv_reads_fp8_weights_as_the_reference_multiplies_them(shape, dtype, block):
    values, scale, block = fp8_weight(*shape, block)
    x = torch.randn(1, shape[1], device=DEVICE, dtype=dtype)
    bias = torch.randn(shape[0], device=DEVICE, dtype=dtype)
    assert_close(gemv(x, values, weight_scale=scale, weight_block=block), reference(x, values, scale, block))
    got = gemv(x, values, bias=bias, weight_scale=scale, weight_block=block)
    assert_close(got, reference(x, values, scale, block, bias))


@pytest.mark.skipif(ON_GPU and not FP8_GPU, reason="FP8 weights need compute capability 8.9")
@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemv_prologues_read_fp8_weights(dtype, block):
    features, inputs = SHAPES[0]
    values, scale, block = fp8_weight(features, inputs, block, seed=1)
    fp8 = dict(weight_scale=scale, weight_block=block)
    x = torch.randn(1, inputs, device=DEVICE, dtype=dtype)
    residual = torch.randn(1, inputs, device=DEVICE, dtype=dtype)
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    got, _ = rms_norm_gemv(x, residual, norm_weight, 1e-6, values, **fp8)
    # the GEMV does not round the normalised row to the dtype: compare with the norm in fp32
    normed = rms_norm((x + residual).float(), norm_weight.float(), 1e-6)
    assert_close(got, reference(normed, values, scale, block).to(dtype))
    gate_up = torch.randn(1, 2 * inputs, device=DEVICE, dtype=dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    activated = (torch.nn.functional.silu(gate.float()) * up.float()).to(dtype)
    assert_close(gated_gemv(gate_up, values, "silu", **fp8), reference(activated, values, scale, block))


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
def test_fp8_gemv_replayed_in_a_graph_reads_new_inputs():
    values, scale, block = fp8_weight(*SHAPES[1], None)
    x = torch.randn(1, SHAPES[1][1], device=DEVICE, dtype=torch.bfloat16)
    gemv(x, values, weight_scale=scale, weight_block=block)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = gemv(x, values, weight_scale=scale, weight_block=block)
    for _ in range(2):
        x.normal_()
        graph.replay()
        assert_close(got, reference(x, values, scale, block))


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
@pytest.mark.parametrize("rows", [2, 17, 256, 4096])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scaled_mm_is_the_reference_product_with_x_quantized_per_token(shape, rows):
    values, scale, block = fp8_weight(*shape, None)
    x = torch.randn(rows, shape[1], device=DEVICE, dtype=torch.bfloat16)
    bias = torch.randn(shape[0], device=DEVICE, dtype=torch.bfloat16)
    want = fp8_linear(x, values, scale, block, bias)
    assert_close(scaled_mm_linear(x, values, scale, bias), want)


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
def test_scaled_mm_replayed_in_a_graph_quantizes_new_inputs():
    values, scale, block = fp8_weight(*SHAPES[1], None)
    x = torch.randn(64, SHAPES[1][1], device=DEVICE, dtype=torch.bfloat16)
    scaled_mm_linear(x, values, scale)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = scaled_mm_linear(x, values, scale)
    for _ in range(2):
        x.normal_()
        graph.replay()
        assert_close(got, fp8_linear(x, values, scale, block))


def block_layer(features: int, inputs: int) -> ReplicatedLinear:
    """A layer holding a random FP8 weight in 128 x 128 blocks."""
    values, scale, block = fp8_weight(features, inputs, (128, 128), seed=2)
    layer = ReplicatedLinear(inputs, features).to(DEVICE)
    layer.weight = torch.nn.Parameter(values, requires_grad=False)
    layer.weight_scale, layer.weight_block = torch.nn.Parameter(scale, requires_grad=False), block
    return layer


def quantized_x_reference(layer: ReplicatedLinear, x: torch.Tensor) -> torch.Tensor:
    return fp8_linear(x, layer.weight, layer.weight_scale, layer.weight_block)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="cuBLASLt's block scaling needs a Hopper GPU")
@pytest.mark.parametrize("rows", [17, 256, 4096])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_layer_with_128_blocks_multiplies_several_rows_on_fp8_tensor_cores(shape, rows):
    layer = block_layer(*shape)
    assert takes_block_scaled_mm(layer.weight, layer.weight_block)
    x = torch.randn(rows, shape[1], device=DEVICE, dtype=torch.bfloat16)
    assert_close(layer(x), quantized_x_reference(layer, x))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="cuBLASLt's block scaling needs a Hopper GPU")
def test_block_scaled_product_replayed_in_a_graph_quantizes_new_inputs():
    layer = block_layer(*SHAPES[1])
    x = torch.randn(61, SHAPES[1][1], device=DEVICE, dtype=torch.bfloat16)  # rows padded to 64 inside
    layer(x)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = layer(x)
    for _ in range(2):
        x.normal_()
        graph.replay()
        assert_close(got, quantized_x_reference(layer, x))


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_GPU, reason="needs a GPU with FP8 tensor cores (compute capability 8.9)")
@pytest.mark.parametrize("rows", [17, 256])
def test_a_layer_with_blocks_cublaslt_does_not_take_multiplies_rows_as_the_reference(rows):
    layer = block_layer(256, 384)  # 3 blocks of columns: not a whole group of 4
    assert not takes_block_scaled_mm(layer.weight, layer.weight_block)
    x = torch.randn(rows, 384, device=DEVICE, dtype=torch.bfloat16)
    want = reference(x, layer.weight, layer.weight_scale, layer.weight_block).to(torch.bfloat16)
    assert_close(layer(x), want)
