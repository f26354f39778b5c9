"""The one-row matrix product of a one-sequence decode step against torch's matmul (on the CPU
under the Triton interpreter, which conftest selects, on small shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_gemv import gemv  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (features, inputs): uneven sizes leave partial tiles; the GPU shapes are the Qwen3-0.6B projections
SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (1000, 3000), (3, 5000)] if ON_GPU else \
         [(40, 70), (9, 1030), (2050, 16)]
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]


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
