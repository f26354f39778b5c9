"""Copies between state slots against PyTorch indexing (on the CPU under the Triton interpreter, which conftest
selects): every layer's rows of the destinations become the sources' (zeros for -1), nothing else moves."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels import triton_slot_copy  # noqa: E402
from nanovllm.kernels.triton_slot_copy import copy_slots  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("state_shape", [(3, 5), (2, 4, 6)])
def test_destinations_take_the_sources_rows_in_every_layer(dtype, state_shape, monkeypatch):
    monkeypatch.setattr(triton_slot_copy, "BLOCK", 16)  # rows of several blocks, the last one partial
    torch.manual_seed(0)
    t = torch.randn(3, 7, *state_shape, device=DEVICE).to(dtype)  # [layers, slots, *shape]
    pairs = [(1, 4), (-1, 0), (6, 2)]
    want = t.clone()
    for source, destination in pairs:
        want[:, destination] = 0 if source < 0 else t[:, source]
    copy_slots(t, torch.tensor(pairs, device=DEVICE))
    assert torch.equal(t, want)


def test_no_pairs_change_nothing():
    t = torch.randn(2, 3, 4, device=DEVICE)
    before = t.clone()
    copy_slots(t, torch.empty(0, 2, dtype=torch.int64, device=DEVICE))
    assert torch.equal(t, before)
