"""The fused experts (two grouped GEMMs over tokens aligned by expert) against the plain-PyTorch experts,
under the Triton interpreter on the CPU (tiny shapes) and compiled on a GPU (a grid of shapes)."""

import pytest
import torch

pytest.importorskip("triton")
from nanovllm.kernels import triton_moe, triton_moe_gemv  # noqa: E402
from nanovllm.kernels.triton_moe import align_by_expert, fused_experts  # noqa: E402
from nanovllm.kernels.triton_moe_gemv import few_token_experts  # noqa: E402
from nanovllm.layers.fused_moe import moe_experts  # noqa: E402
from nanovllm.layers.layernorm import rms_norm  # noqa: E402
from nanovllm.layers.moe_routing import route  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def experts_case(tokens, experts, top_k, hidden, width, dtype, seed=0, skew=None):
    """x, w13, w2 and a routing of `tokens` tokens; `skew`: "all-one" routes every token's first choice to
    expert 0, "few" leaves all but top_k experts unused."""
    torch.manual_seed(seed)
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=dtype)
    w13 = torch.randn(experts, 2 * width, hidden, device=DEVICE, dtype=dtype) / hidden**0.5
    w2 = torch.randn(experts, hidden, width, device=DEVICE, dtype=dtype) / width**0.5
    logits = torch.randn(tokens, experts, device=DEVICE)
    if skew == "all-one":
        logits[:, 0] += 100.0
    elif skew == "few":
        logits[:, top_k:] -= 100.0
    weights, ids = route(logits, top_k, renormalize=True)
    return x, w13, w2, weights, ids


def check(case, hidden_act="silu", biased=False):
    """`biased`: every projection adds a random bias (gpt-oss's experts)."""
    x, w13, w2, weights, ids = case
    biases = {}
    if biased:
        biases = dict(w13_bias=torch.randn_like(w13[:, :, 0]), w2_bias=torch.randn_like(w2[:, :, 0]))
    want = moe_experts(x, w13, w2, weights, ids, hidden_act, *biases.values())
    got = fused_experts(x, w13, w2, weights, ids, hidden_act, **biases)
    tolerance = TOLERANCE[x.dtype]
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    if biased:  # the biases count
        assert not torch.allclose(got, fused_experts(x, w13, w2, weights, ids, hidden_act), atol=tolerance)


def test_align_puts_each_expert_in_whole_blocks_and_every_slot_once():
    ids = torch.tensor([[3, 1], [1, 0], [3, 1]], device=DEVICE)  # slots 0..5: experts 3, 1, 1, 0, 3, 1
    sorted_slots, block_experts, num_rows = align_by_expert(ids, num_experts=5, block_m=4)
    pad = 6
    # expert 0: slot 3; expert 1: slots 1, 2, 5; expert 3: slots 0, 4 -- each run padded to 4 rows, the
    # slots within a run in no particular order
    assert num_rows.item() == 12
    runs = sorted_slots[:12].view(3, 4).tolist()
    assert [sorted(run) for run in runs] == [[3, pad, pad, pad], [1, 2, 5, pad], [0, 4, pad, pad]]
    # 6 slots + at most 5 experts x 3 padding rows, in whole blocks: fixed by the token count alone; the
    # blocks past the runs belong to no expert (5)
    assert sorted_slots.numel() == 24
    assert block_experts.tolist() == [0, 1, 3, 5, 5, 5]


@pytest.mark.parametrize("tokens, experts, top_k, block_m", [(1, 8, 2, 16), (37, 6, 3, 4), (300, 128, 8, 64)])
def test_align_places_every_slot_in_its_experts_run(tokens, experts, top_k, block_m):
    ids = torch.rand(tokens, experts, device=DEVICE).argsort(dim=-1)[:, :top_k]
    sorted_slots, block_experts, num_rows = align_by_expert(ids, experts, block_m)
    rows = num_rows.item()
    slots = sorted_slots[:rows].long()
    is_slot = slots < ids.numel()
    assert sorted(slots[is_slot].tolist()) == list(range(ids.numel()))  # every slot once
    row_experts = block_experts[: rows // block_m].long().repeat_interleave(block_m)
    assert torch.equal(ids.flatten()[slots[is_slot]], row_experts[is_slot])  # in a block of its expert
    counts = torch.bincount(ids.flatten(), minlength=experts)
    assert rows == ((counts + block_m - 1) // block_m * block_m).sum().item()  # no more padding than needed
    assert (block_experts[rows // block_m :] == experts).all()


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize(
    "tokens, skew", [(1, None), (5, None), (20, "all-one"), (20, "few")], ids=["one", "five", "all-one", "few"]
)
def test_matches_the_pytorch_experts_interpreted(tokens, skew, hidden_act):
    check(experts_case(tokens, experts=6, top_k=2, hidden=40, width=24, dtype=torch.float32, skew=skew), hidden_act)


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
@pytest.mark.parametrize("grouped", [False, True], ids=["few-token", "grouped"])
def test_gpt_oss_experts_add_their_biases_and_clamp_interpreted(monkeypatch, grouped):
    # 3 tokens through the few-token kernels, or through the grouped GEMMs; x scaled up so that some gate and up
    # values pass gpt-oss's clamp at 7
    if grouped:
        monkeypatch.setattr(triton_moe, "FEW_TOKENS", 0)
    x, w13, w2, weights, ids = experts_case(3, experts=6, top_k=2, hidden=40, width=24, dtype=torch.float32)
    x = x * 20.0
    assert (torch.einsum("th,eih->tei", x, w13).abs() > 7).any()
    check((x, w13, w2, weights, ids), "gpt_oss_swiglu", biased=True)


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
@pytest.mark.parametrize("tokens", [1, 3])
def test_few_tokens_through_the_grouped_gemms_too_interpreted(monkeypatch, tokens):
    # what a few tokens would give without their own kernels
    monkeypatch.setattr(triton_moe, "FEW_TOKENS", 0)
    check(experts_case(tokens, experts=6, top_k=2, hidden=40, width=24, dtype=torch.float32))


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
@pytest.mark.parametrize("hidden_act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.slow
def test_few_token_experts_read_each_choices_expert_interpreted(hidden_act):
    # widths past one block of each kernel, and two tokens choosing the same expert; a narrow hidden size,
    # since the down kernel runs a program per output feature and the interpreter runs them one by one
    case = experts_case(4, experts=3, top_k=2, hidden=40, width=300, dtype=torch.float32)
    case[4][1, 0] = case[4][0, 0]
    check(case, hidden_act)


def check_normalised(case, tolerance):
    """The few-token kernels normalising x themselves against the norm, then the PyTorch experts."""
    x, w13, w2, weights, ids = case
    norm_weight = torch.rand(x.size(1), device=x.device, dtype=x.dtype) + 0.5
    x = x * 3.0  # away from unit scale, so that a missing norm shows
    want = moe_experts(rms_norm(x, norm_weight, 1e-6), w13, w2, weights, ids, "silu")
    got = few_token_experts(x, w13, w2, weights, ids, "silu", norm_weight, 1e-6)
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
def test_few_token_experts_normalise_their_input_interpreted(monkeypatch):
    # a row past one chunk of the gate/up kernel: the squares are summed over every chunk; the down kernel,
    # which the norm does not touch, takes many output features a program, so that the interpreter stays quick
    monkeypatch.setattr(triton_moe_gemv, "_DOWN_BLOCKS", (64, 64, 4))
    check_normalised(experts_case(2, experts=3, top_k=2, hidden=1100, width=40, dtype=torch.float32), 1e-4)


@pytest.mark.skipif(CUDA, reason="the compiled kernels are tested on the GPU instead")
@pytest.mark.slow
def test_large_batch_tiles_interpreted(monkeypatch):
    # the largest tile row, on few tokens, so that the interpreter stays quick
    monkeypatch.setattr(triton_moe, "TILES", {1: triton_moe.TILES[max(triton_moe.TILES)]})
    check(experts_case(9, experts=4, top_k=2, hidden=70, width=40, dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 64, 300, 2048])
@pytest.mark.parametrize(
    "experts, top_k, hidden, width", [(8, 2, 512, 384), (128, 8, 256, 96), (16, 4, 200, 72)], ids=str
)
@pytest.mark.parametrize("skew", [None, "all-one", "few"])
def test_matches_the_pytorch_experts_on_gpu(dtype, tokens, experts, top_k, hidden, width, skew):
    check(experts_case(tokens, experts, top_k, hidden, width, dtype, skew=skew))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_gpt_oss_experts_on_gpu(dtype, tokens):
    # gpt-oss-20b's experts at a quarter of their width: 32 experts, top-4, hidden 2880
    check(experts_case(tokens, 32, 4, 2880, 720, dtype), "gpt_oss_swiglu", biased=True)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 5])
def test_few_token_experts_normalise_their_input_on_gpu(dtype, tokens):
    check_normalised(experts_case(tokens, 128, 8, 2048, 768, dtype), TOLERANCE[dtype])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tokens", [1, 64])
def test_replayed_in_a_graph_follows_new_routings(tokens):
    x, w13, w2, weights, ids = experts_case(tokens, 64, 8, 256, 128, torch.bfloat16)
    fused_experts(x, w13, w2, weights, ids, "silu")  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, w13, w2, weights, ids, "silu")
    for seed in (1, 2):
        _, _, _, new_weights, new_ids = experts_case(tokens, 64, 8, 256, 128, torch.bfloat16, seed=seed)
        x.normal_()
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        graph.replay()
        want = moe_experts(x, w13, w2, weights, ids, "silu")
        torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
