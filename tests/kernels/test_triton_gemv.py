"""The one-row matrix products of a one-sequence decode step, plain and with the norm or the
activation read in front, against torch (on the CPU under the Triton interpreter, which conftest
selects, on small shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_gemv import gated_gemv, gemv, rms_norm_gemv  # noqa: E402
from nanovllm.layers.layernorm import rms_norm  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (features, inputs): uneven sizes leave partial tiles; the GPU shapes are the Qwen3-0.6B projections
SHAPES = (
    [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (1000, 3000), (3, 5000)]
    if ON_GPU
    else [(40, 70), (9, 1030), (2050, 16)]
)
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]
# hidden_act -> the activation in float64
ACTIVATIONS = {
    "silu": torch.nn.functional.silu,
    "gelu_pytorch_tanh": lambda gate: torch.nn.functional.gelu(gate, approximate="tanh"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_torch_matmul(shape, dtype):
    features, inputs = shape
    torch.manual_seed(0)
    x = torch.randn(1, inputs, device=DEVICE, dtype=dtype)
    weight = torch.randn(features, inputs, device=DEVICE, dtype=dtype) / inputs**0.5
    want = (x.double() @ weight.double().T).to(dtype)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(gemv(x, weight), want, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_product_adds_its_bias_before_rounding(dtype):
    torch.manual_seed(4)
    features, inputs = SHAPES[0]
    x = torch.randn(1, inputs, device=DEVICE, dtype=dtype)
    gate_up = torch.randn(1, 2 * inputs, device=DEVICE, dtype=dtype)
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    weight = torch.randn(features, inputs, device=DEVICE, dtype=dtype) / inputs**0.5
    bias = torch.randn(features, device=DEVICE, dtype=dtype)
    gate, up = gate_up.double().chunk(2, dim=-1)
    normed = rms_norm(x, norm_weight, 1e-6).double()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for got, product in (
        (gemv(x, weight, bias=bias), x.double()),
        (rms_norm_gemv(x, None, norm_weight, 1e-6, weight, bias)[0], normed),
        (gated_gemv(gate_up, weight, "silu", bias), torch.nn.functional.silu(gate) * up),
    ):
        want = (product @ weight.double().T + bias.double()).to(dtype)
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_writes_into_the_row_it_is_given():
    # the LM head of a decode graph writes its logits into one buffer the graphs share
    torch.manual_seed(3)
    x = torch.randn(1, 70, device=DEVICE)
    weight = torch.randn(40, 70, device=DEVICE) / 70**0.5
    buffer = torch.full((3, 40), float("nan"), device=DEVICE)
    got = gemv(x, weight, out=buffer[:1])
    assert got.data_ptr() == buffer.data_ptr() and torch.equal(buffer[:1], gemv(x, weight))
    assert buffer[1:].isnan().all()


@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norm_in_front_equals_the_norm_then_the_product(shape, dtype, with_residual):
    features, inputs = shape
    torch.manual_seed(1)
    x = torch.randn(1, inputs, device=DEVICE, dtype=dtype)
    residual = torch.randn(1, inputs, device=DEVICE, dtype=dtype) if with_residual else None
    norm_weight = torch.rand(inputs, device=DEVICE, dtype=dtype) + 0.5
    weight = torch.randn(features, inputs, device=DEVICE, dtype=dtype) / inputs**0.5
    want_sum = x + residual if with_residual else x
    normed = rms_norm(want_sum, norm_weight, 1e-6)
    want = (normed.double() @ weight.double().T).to(dtype)
    got, got_sum = rms_norm_gemv(x, residual, norm_weight, 1e-6, weight)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(got_sum, want_sum, atol=0, rtol=0)


@pytest.mark.parametrize("hidden_act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_activation_in_front_equals_the_activation_then_the_product(shape, dtype, hidden_act):
    features, inputs = shape
    torch.manual_seed(2)
    # gates out to +-12, where GELU's tanh saturates and SiLU's exp is far from 1
    gate_up = torch.randn(1, 2 * inputs, device=DEVICE, dtype=dtype) * 4
    weight = torch.randn(features, inputs, device=DEVICE, dtype=dtype) / inputs**0.5
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = ((ACTIVATIONS[hidden_act](gate) * up) @ weight.double().T).to(dtype)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    got = gated_gemv(gate_up, weight, hidden_act)
    torch.testing.assert_close(got, want, atol=tolerance * 4, rtol=tolerance)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU: graphs and programmatic dependent launch")
def test_a_chain_of_products_replayed_in_a_graph_reads_each_input_after_it_is_written():
    # on Hopper each product starts while the one before it finishes; one that read its input
    # before waiting would read the previous replay's values
    torch.manual_seed(3)
    weights = [torch.randn(1024, 1024, device="cuda") / 32 for _ in range(40)]
    x = torch.randn(1, 1024, device="cuda")

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
