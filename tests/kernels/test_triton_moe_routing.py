"""The one-launch routing kernel against the PyTorch routing (`layers/moe_routing.route`), under the Triton
interpreter on the CPU (tiny shapes) and compiled on a GPU."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels.triton_moe_routing import route_experts  # noqa: E402
from nanovllm.layers.moe_routing import route  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []


def check(tokens, experts, top_k, renormalize, dtype=torch.float32, seed=0, shared_gate=False):
    torch.manual_seed(seed)
    # each row a permutation of distinct values, distinct in bf16 too: the order of equal logits is unspecified
    columns = experts + shared_gate
    ranks = torch.rand(tokens, columns + 3, device=DEVICE).argsort(dim=-1)
    logits = (ranks * (7.8 / (columns + 3)) - 3.9).to(dtype)[:, 3:]  # strided rows
    want_weights, want_ids = route(logits, top_k, renormalize, shared_gate)
    weights, ids = route_experts(logits, top_k, renormalize, shared_gate)
    assert ids.dtype == want_ids.dtype and weights.dtype == torch.float32
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    if renormalize:
        torch.testing.assert_close(weights[:, :top_k].sum(-1), torch.ones(tokens, device=DEVICE))


@pytest.mark.skipif(CUDA, reason="the compiled kernel is tested on the GPU instead")
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (6, 3), (20, 8)], ids=str)
def test_matches_the_pytorch_routing_interpreted(experts, top_k, renormalize):
    check(5, experts, top_k, renormalize)


@pytest.mark.skipif(CUDA, reason="the compiled kernel is tested on the GPU instead")
@pytest.mark.parametrize("renormalize", [True, False])
def test_a_shared_expert_joins_every_token_last_with_its_gates_sigmoid_interpreted(renormalize):
    check(5, 20, 8, renormalize, shared_gate=True)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 300])
def test_a_shared_expert_joins_every_token_last_with_its_gates_sigmoid_on_gpu(tokens):
    check(tokens, 256, 8, True, torch.bfloat16, shared_gate=True)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens", [1, 7, 4096])
@pytest.mark.parametrize("experts, top_k", [(8, 2), (60, 4), (128, 8), (256, 8)], ids=str)
def test_matches_the_pytorch_routing_on_gpu(tokens, experts, top_k, renormalize, dtype):
    check(tokens, experts, top_k, renormalize, dtype)
