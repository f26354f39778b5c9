"""The one-launch routing kernel against the PyTorch routing (`layers/moe_routing.route`), under the Triton
interpreter on the CPU (tiny shapes) and compiled on a GPU."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_moe_routing import route_experts  # noqa: E402
from nanovllm.layers.moe_routing import route  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def check(tokens, experts, top_k, renormalize, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    # each row a permutation of distinct values, distinct in bf16 too: the order of equal logits is unspecified
    ranks = torch.rand(tokens, experts + 3, device=DEVICE).argsort(dim=-1)
    logits = (ranks * (7.8 / (experts + 3)) - 3.9).to(dtype)[:, 3:]  # strided rows
    want_weights, want_ids = route(logits, top_k, renormalize)
    weights, ids = route_experts(logits, top_k, renormalize)
    assert ids.dtype == want_ids.dtype and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(tokens, device=DEVICE))


@pytest.mark.skipif(CUDA, reason="the compiled kernel is tested on the GPU instead")
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (6, 3), (20, 8)], ids=str)
def test_matches_the_pytorch_routing_interpreted(experts, top_k, renormalize):
    check(5, experts, top_k, renormalize)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [1, 7, 4096])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (60, 4), (128, 8), (256, 8)], ids=str)
def test_matches_the_pytorch_routing_on_gpu(tokens, experts, top_k, renormalize, dtype):
    check(tokens, experts, top_k, renormalize, dtype)
