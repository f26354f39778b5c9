"""The fused experts reading MXFP4 weights (dequantized inside the kernels) against the PyTorch experts, which
dequantize each expert first: the few-token kernels and the grouped GEMMs, under the Triton interpreter on the
CPU (tiny shapes) and compiled on a GPU (gpt-oss-20b's experts, eagerly and in a CUDA graph)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels import triton_moe, triton_moe_gemv  # noqa: E402
from nanovllm.kernels.mxfp4 import quantize  # noqa: E402
from nanovllm.kernels.triton_moe import fused_experts  # noqa: E402
from nanovllm.kernels.triton_moe_gemv import few_token_experts  # noqa: E402
from nanovllm.layers.fused_moe import moe_experts  # noqa: E402
from nanovllm.layers.layernorm import rms_norm  # noqa: E402
from nanovllm.layers.moe_routing import route  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
interpreted = pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")


def mxfp4_case(tokens, experts, top_k, hidden, width, dtype, seed=0) -> dict:
    """x, MXFP4 experts with biases (gpt-oss's) and a routing of `tokens` tokens, as `moe_experts` takes them."""
    torch.manual_seed(seed)
    w13, w13_scale = quantize(torch.randn(experts, 2 * width, hidden, device=DEVICE) / hidden**0.5)
    w2, w2_scale = quantize(torch.randn(experts, hidden, width, device=DEVICE) / width**0.5)
    weights, ids = route(torch.randn(tokens, experts, device=DEVICE), top_k, renormalize=True)
    return dict(
        x=torch.randn(tokens, hidden, device=DEVICE, dtype=dtype),
        w13=w13,
        w2=w2,
        weights=weights,
        ids=ids,
        hidden_act="gpt_oss_swiglu",
        w13_bias=torch.randn(experts, 2 * width, device=DEVICE, dtype=dtype),
        w2_bias=torch.randn(experts, hidden, device=DEVICE, dtype=dtype),
        w13_scale=w13_scale,
        w2_scale=w2_scale,
    )


def check(case: dict, experts=fused_experts) -> None:
    """`experts` (the fused kernels, or the few-token ones alone) give what the PyTorch experts do."""
    want = moe_experts(**case)
    torch.testing.assert_close(experts(**case), want, atol=TOLERANCE[want.dtype], rtol=TOLERANCE[want.dtype])


@interpreted
@pytest.mark.parametrize("tokens", [1, 3])
def test_few_token_kernels_dequantize_as_the_pytorch_experts_interpreted(tokens):
    check(mxfp4_case(tokens, experts=4, top_k=2, hidden=64, width=96, dtype=torch.float32), few_token_experts)


@interpreted
def test_few_token_kernels_over_several_chunks_interpreted(monkeypatch):
    # chunks of 32 inputs (one block each): several per row, the last of the down rows half masked
    monkeypatch.setattr(triton_moe_gemv, "_MXFP4_GATE_UP_BLOCKS", (8, 32, 4))
    monkeypatch.setattr(triton_moe_gemv, "_MXFP4_DOWN_BLOCKS", (8, 64, 4))
    case = mxfp4_case(2, experts=3, top_k=2, hidden=96, width=96, dtype=torch.float32)
    case["ids"][1, 0] = case["ids"][0, 0]  # two tokens through one expert
    check(case, few_token_experts)


@interpreted
def test_few_token_kernels_normalise_their_input_interpreted():
    case = mxfp4_case(2, experts=3, top_k=2, hidden=64, width=32, dtype=torch.float32)
    norm_weight = torch.rand(64) + 0.5
    x = case.pop("x") * 3.0  # away from unit scale, so that a missing norm shows
    want = moe_experts(rms_norm(x, norm_weight, 1e-6), **case)
    got = few_token_experts(x, **case, norm_weight=norm_weight, eps=1e-6)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@interpreted
@pytest.mark.parametrize("tokens", [3, 20])
def test_grouped_gemms_dequantize_as_the_pytorch_experts_interpreted(monkeypatch, tokens):
    monkeypatch.setattr(triton_moe, "MXFP4_FEW_TOKENS", 0)
    check(mxfp4_case(tokens, experts=4, top_k=2, hidden=64, width=96, dtype=torch.float32))


@interpreted
def test_grouped_gemms_over_several_chunks_interpreted(monkeypatch):
    # chunks of 32 inputs (16 bytes, one block): several per row, the last of the down rows half masked
    monkeypatch.setattr(triton_moe, "MXFP4_FEW_TOKENS", 0)
    monkeypatch.setattr(triton_moe, "MXFP4_TILES", {1: (16, 32, 32, 4, 2)})
    check(mxfp4_case(9, experts=3, top_k=2, hidden=96, width=96, dtype=torch.float32))


def gpt_oss_20b_case(tokens: int, seed: int = 0) -> dict:
    """gpt-oss-20b's experts in bf16 activations: 32 experts, top-4, hidden 2880, width 2880."""
    return mxfp4_case(tokens, experts=32, top_k=4, hidden=2880, width=2880, dtype=torch.bfloat16, seed=seed)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 5, 64, 300])
def test_gpt_oss_20b_experts_on_gpu(tokens):
    check(gpt_oss_20b_case(tokens))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 4, 64])
def test_replayed_in_a_graph_follows_new_routings_on_gpu(tokens):
    case = gpt_oss_20b_case(tokens)
    fused_experts(**case)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(**case)
    for seed in (1, 2):
        new = gpt_oss_20b_case(tokens, seed)
        for name in ("x", "weights", "ids"):
            case[name].copy_(new[name])
        graph.replay()
        torch.testing.assert_close(out, moe_experts(**case), atol=2e-2, rtol=2e-2)
