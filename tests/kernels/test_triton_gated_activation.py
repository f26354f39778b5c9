"""The gated activation of an MLP step with several rows, act(gate) * up, against PyTorch's activations
(on the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_gated_activation import gated_activation  # noqa: E402
from nanovllm.layers.activation import ACTIVATIONS  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32, torch.bfloat16]
# (rows, intermediate): a partial block, several blocks, and Qwen2.5-7B's width on the GPU
SHAPES = [(3, 70), (2, 2500), (0, 16)] + ([(256, 18944)] if ON_GPU else [])


@pytest.mark.parametrize("hidden_act", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_the_activation_times_up_rounded_once(shape, dtype, hidden_act):
    rows, width = shape
    torch.manual_seed(0)
    # gates out to +-16, where GELU's tanh and SiLU's exp saturate
    gate_up = torch.randn(rows, 2 * width, device=DEVICE, dtype=dtype) * 4
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = (ACTIVATIONS[hidden_act](gate) * up).to(dtype)
    got = gated_activation(gate_up, hidden_act)
    assert got.shape == (rows, width) and got.dtype == dtype
    # fp32 arithmetic rounded once: within one rounding of the exact value
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_reads_rows_of_a_strided_view():
    torch.manual_seed(1)
    wide = torch.randn(4, 300, device=DEVICE)
    gate_up = wide[:, :200]  # rows 300 apart
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(
        gated_activation(gate_up, "silu"), torch.nn.functional.silu(gate) * up, atol=1e-6, rtol=1e-6
    )
