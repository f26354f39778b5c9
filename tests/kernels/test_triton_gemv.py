"""The matrix products of a few rows (a decode step of one or a few sequences, a speculative verify step),
plain, with the norm read in front, with the gated activation read in front (one row) or written behind
(several rows: the weight being gate | up), with a bias and with FP8 weights,
against a float64 reference (on the CPU under the Triton interpreter, which conftest selects, on small
shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels import triton_gemv  # noqa: E402
from nanovllm.kernels.fp8_weights import dequantize_blocks, fp8_linear, quantize_blocks  # noqa: E402
from nanovllm.kernels.triton_gemv import MAX_ROWS, gated_gemv, gemv, rms_norm_gemv  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
# (features, inputs): uneven sizes leave partial tiles; the GPU shapes are the Qwen3-0.6B projections
SHAPES = (
    [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (1000, 3000), (3, 5000)]
    if ON_GPU
    else [(40, 70), (9, 1030), (258, 16)]
)
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
# one row, a power of two, one rounded up to the next (its padding rows masked), and the most
ROW_COUNTS = [1, 2, 5, MAX_ROWS]
# hidden_act -> the activation in float64
ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu_pytorch_tanh": lambda gate: torch.nn.functional.gelu(gate, approximate="tanh"),
}
FP8_BLOCKS = {"per-channel": None, "128x128": (128, 128)}


def tolerance(dtype: torch.dtype) -> float:
    return 2e-2 if dtype == torch.bfloat16 else 1e-5


def random_rows(rows: int, inputs: int, dtype: torch.dtype) -> torch.Tensor:
    """[rows, inputs], each row at its own scale (1/4 to 4): a row normalised by another's mean square,
    or given another's sums, is far off."""
    scale = torch.logspace(-2, 2, rows, base=2, device=DEVICE)[:, None] if rows > 1 else 1.0
    return (torch.randn(rows, inputs, device=DEVICE) * scale).to(dtype)


def random_weight(features: int, inputs: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(features, inputs, device=DEVICE) / inputs**0.5).to(dtype)


def normed(x: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of each row in float64 (the GEMV does not round the normalised rows to the dtype)."""
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_weight.double()


def fp8_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] quantized to float8 per row and 128 columns and restored, in float64: what the rows kernel
    multiplies block-FP8 weights with."""
    values, scale = quantize_blocks(x.float(), (1, 128))
    return dequantize_blocks(values, scale, (1, 128)).double()


def normed_fp8_rows(h: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm of each row of h as the rows kernel multiplies it with block-FP8 weights: h * weight rounded to
    the dtype and quantized (`fp8_rows`), the row's 1/rms applied to the products."""
    rstd = torch.rsqrt(h.double().pow(2).mean(-1, keepdim=True) + 1e-6)
    return fp8_rows((h.float() * norm_weight.float()).to(h.dtype)) * rstd


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_torch_matmul(shape, dtype, rows):
    features, inputs = shape
    torch.manual_seed(0)
    x = random_rows(rows, inputs, dtype)
    weight = random_weight(features, inputs, dtype)
    want = (x.double() @ weight.double().T).to(dtype)
    torch.testing.assert_close(gemv(x, weight), want, atol=tolerance(dtype), rtol=tolerance(dtype))


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_product_adds_its_bias_before_rounding(dtype, rows):
    torch.manual_seed(4)
    features, inputs = SHAPES[0]
    x = random_rows(rows, inputs, dtype)
    gate_up = random_rows(rows, 2 * inputs, dtype)
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    weight = random_weight(features, inputs, dtype)
    bias = torch.randn(features, device=DEVICE, dtype=dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    products = [(gemv(x, weight, bias=bias), x.double())]
    if rows == 1:  # a norm or an activation is read in front of one row only
        products += [
            (rms_norm_gemv(x, None, norm_weight, 1e-6, weight, bias)[0], normed(x, norm_weight)),
            (gated_gemv(gate_up, weight, "silu", bias), torch.nn.functional.silu(gate) * up),
        ]
    for got, product in products:
        want = (product @ weight.double().T + bias.double()).to(dtype)
        torch.testing.assert_close(got, want, atol=tolerance(dtype) * 4, rtol=tolerance(dtype))


@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_reads_and_writes_rows_where_they_lie(rows):
    # the LM head of a decode graph writes its logits into rows of one buffer the graphs share, and its
    # input may be rows of a wider tensor
    torch.manual_seed(3)
    x = torch.randn(rows, 100, device=DEVICE)[:, :70]
    weight = random_weight(40, 70, torch.float32)
    buffer = torch.full((MAX_ROWS + 1, 50), float("nan"), device=DEVICE)
    got = gemv(x, weight, out=buffer[:rows, :40])
    assert got.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer[:rows, :40], (x.double() @ weight.double().T).float())
    assert buffer[rows:].isnan().all() and buffer[:, 40:].isnan().all()


@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_in_front_equals_the_norm_then_the_product(shape, dtype, with_residual, rows):
    features, inputs = shape
    torch.manual_seed(1)
    x = random_rows(rows, inputs, dtype)
    residual = random_rows(rows, inputs, dtype).flip(0) if with_residual else None
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    weight = random_weight(features, inputs, dtype)
    want_sum = x + residual if with_residual else x
    want = (normed(want_sum, norm_weight) @ weight.double().T).to(dtype)
    got, got_sum = rms_norm_gemv(x, residual, norm_weight, 1e-6, weight)
    torch.testing.assert_close(got, want, atol=tolerance(dtype), rtol=tolerance(dtype))
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)


@pytest.mark.parametrize("rows", ROW_COUNTS[1:])
@pytest.mark.parametrize("hidden_act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_several_rows_write_the_gated_activation_of_the_normed_product(shape, dtype, hidden_act, rows):
    # the weight is gate | up: each output feature pairs a gate feature with the up feature half the rows on
    features, inputs = shape
    torch.manual_seed(4)
    x, residual = random_rows(rows, inputs, dtype), random_rows(rows, inputs, dtype).flip(0)
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    weight = random_weight(2 * features, inputs, dtype) * 3  # gates out to about +-9
    bias = torch.randn(2 * features, device=DEVICE, dtype=dtype)
    gate, up = (normed(x + residual, norm_weight) @ weight.double().T + bias.double()).to(dtype).double().chunk(2, -1)
    got, got_sum = rms_norm_gemv(x, residual, norm_weight, 1e-6, weight, bias, hidden_act=hidden_act)
    torch.testing.assert_close(
        got, (ACTIVATIONS[hidden_act](gate) * up).to(dtype), atol=tolerance(dtype) * 16, rtol=tolerance(dtype) * 2
    )
    torch.testing.assert_close(got_sum, x + residual, atol=0, rtol=0)


@pytest.mark.parametrize("hidden_act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_activation_in_front_equals_the_activation_then_the_product(shape, dtype, hidden_act):
    features, inputs = shape
    torch.manual_seed(2)
    # gates out to +-12, where GELU's tanh saturates and SiLU's exp is far from 1
    gate_up = torch.randn(1, 2 * inputs, device=DEVICE, dtype=dtype) * 4
    weight = random_weight(features, inputs, dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = ((ACTIVATIONS[hidden_act](gate) * up) @ weight.double().T).to(dtype)
    got = gated_gemv(gate_up, weight, hidden_act)
    torch.testing.assert_close(got, want, atol=tolerance(dtype) * 4, rtol=tolerance(dtype))


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability() < (8, 9), reason="FP8 needs compute capability 8.9")
@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("block", FP8_BLOCKS.values(), ids=FP8_BLOCKS.keys())
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_weights_in_every_prologue(dtype, block, rows):
    # uneven on both axes: partial blocks of scales; on a GPU the size of a Qwen3-8B projection's rows
    features, inputs = (4096 + 128, 4096 + 72) if ON_GPU else (264, 300)
    torch.manual_seed(5)
    block = (1, inputs) if block is None else block
    values, scale = quantize_blocks(random_weight(features, inputs, torch.float32), block)
    dequantized = dequantize_blocks(values, scale, block).double()  # [features, inputs]
    fp8 = dict(weight_scale=scale, weight_block=block)
    x = random_rows(rows, inputs, dtype)
    residual = random_rows(rows, inputs, dtype)
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    gate_up = random_rows(rows, 2 * inputs, dtype)
    bias = torch.randn(features, device=DEVICE, dtype=dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    activated = (torch.nn.functional.silu(gate) * up).to(dtype)  # the prologue rounds it to the dtype
    # several rows of block-FP8 weights are multiplied on the FP8 tensor cores, x quantized like the weights
    fp8_x = rows > 1 and block == (128, 128)
    normed_sum = normed_fp8_rows(x + residual, norm_weight) if fp8_x else normed(x + residual, norm_weight)
    products = [
        (gemv(x, values, bias=bias, **fp8), fp8_rows(x) if fp8_x else x.double()),
        (rms_norm_gemv(x, residual, norm_weight, 1e-6, values, bias, **fp8)[0], normed_sum),
    ]
    if rows == 1:
        products.append((gated_gemv(gate_up, values, "silu", bias, **fp8), activated.double()))
    for got, product in products:
        want = (product @ dequantized.T + bias.double()).to(dtype)
        torch.testing.assert_close(got, want, atol=tolerance(dtype) * 4, rtol=tolerance(dtype) * 2)
    if rows > 1:  # the leading rows of the weight as gate | up, each half whole blocks of rows
        half = features // 2 // block[0] * block[0]
        gate, up = (normed_sum @ dequantized[: 2 * half].T + bias[: 2 * half].double()).to(dtype).double().chunk(2, -1)
        fp8 = dict(weight_scale=scale[: 2 * half // block[0]], weight_block=block)
        got = rms_norm_gemv(
            x, residual, norm_weight, 1e-6, values[: 2 * half], bias[: 2 * half], hidden_act="silu", **fp8
        )[0]
        want = (torch.nn.functional.silu(gate) * up).to(dtype)
        torch.testing.assert_close(got, want, atol=tolerance(dtype) * 4, rtol=tolerance(dtype) * 2)


@pytest.mark.skipif(ON_GPU and torch.cuda.get_device_capability() < (8, 9), reason="FP8 needs compute capability 8.9")
@pytest.mark.parametrize("inputs", [300, 298], ids=["int32 words", "bytes"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("fused", ["none", "norm", "norm+residual", "activation"])
@pytest.mark.parametrize("block", FP8_BLOCKS.values(), ids=FP8_BLOCKS.keys())
def test_fp8_one_row_over_several_chunks_equals_the_reference(block, fused, with_bias, inputs, monkeypatch):
    # chunks of 64 columns: five over the inputs, the last one partial, as is its last group of 16 columns (rows
    # of 298 bytes are no whole int32 words); 270 features: the last program's partial, and so are the last
    # blocks of scales on both axes
    monkeypatch.setattr(triton_gemv, "FP8_BLOCKS", dict.fromkeys(triton_gemv.FP8_BLOCKS, (8, 64, 4)))
    features = 270
    torch.manual_seed(6)
    block = (1, inputs) if block is None else block
    rows, columns = torch.arange(features, device=DEVICE), torch.arange(inputs, device=DEVICE)
    # every row and every block of 128 x 128 at its own magnitude: a scale applied to another's values is far off
    magnitude = (1 + torch.rand(features, 1, device=DEVICE)) * (1 + rows[:, None] // 128 + 3 * (columns // 128))
    values, scale = quantize_blocks(random_weight(features, inputs, torch.float32) * magnitude, block)
    fp8 = dict(weight_scale=scale, weight_block=block)
    bias = torch.randn(features, device=DEVICE) if with_bias else None
    x, residual = random_rows(1, inputs, torch.float32), random_rows(1, inputs, torch.float32)
    norm_weight = torch.rand(inputs, device=DEVICE) + 0.5
    if fused == "activation":
        gate_up = random_rows(1, 2 * inputs, torch.float32) * 4
        gate, up = gate_up.chunk(2, dim=-1)
        got, product = gated_gemv(gate_up, values, "silu", bias, **fp8), torch.nn.functional.silu(gate) * up
    elif fused == "none":
        got, product = gemv(x, values, bias=bias, **fp8), x
    else:
        residual = residual if fused == "norm+residual" else None
        got = rms_norm_gemv(x, residual, norm_weight, 1e-6, values, bias, **fp8)[0]
        product = normed(x if residual is None else x + residual, norm_weight).float()
    want = fp8_linear(product, values, scale, block, bias, quantize_x=False)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: graphs and programmatic dependent launch")
@pytest.mark.parametrize("rows", [1, 5])
def test_a_chain_of_products_replayed_in_a_graph_reads_each_input_after_it_is_written(rows):
    # on Hopper each product starts while the one before it finishes; one that read its input
    # before waiting would read the previous replay's values
    torch.manual_seed(3)
    weights = [torch.randn(1024, 1024, device="cuda") / 32 for _ in range(40)]
    x = torch.randn(rows, 1024, device="cuda")

    def chain() -> torch.Tensor:
        y = x
        for weight in weights:
            y = gemv(y, weight)
        return y

    chain()  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        want = x.double()
        for weight in weights:
            want = want @ weight.double().T
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-3)
