"""The Triton grammar-mask kernel against its PyTorch reference (on the CPU under the Triton interpreter,
which conftest selects)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_bitmask import apply_bitmask_ as apply_on_device  # noqa: E402
from nanovllm.sample.bitmask import apply_bitmask_  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_writes_what_the_reference_writes(dtype):
    torch.manual_seed(1)
    vocab = 4096 + 100  # a full block and a partial one
    logits = torch.randn(4, vocab, dtype=dtype)
    bitmask = torch.randint(-(1 << 31), 1 << 31, (4, (vocab + 31) // 32), dtype=torch.int64).to(torch.int32)
    rows = torch.tensor([3, 0], dtype=torch.int32)
    expected = logits.clone()
    apply_bitmask_(expected, bitmask, rows)  # on the CPU: the PyTorch reference
    ours = logits.to(DEVICE)
    apply_on_device(ours, bitmask.to(DEVICE), rows.to(DEVICE))
    assert torch.equal(ours.cpu(), expected)
    assert torch.isinf(expected[3]).any() and torch.equal(expected[1], logits[1])
