"""The causal convolution's Triton kernels against the PyTorch reference (`torch_causal_conv.py`) on the same
inputs: outputs, the states they leave in their slots (and no other slot), and the per-position states (on
the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from nanovllm.kernels import triton_causal_conv  # noqa: E402
from nanovllm.kernels.torch_causal_conv import causal_conv_queries, causal_conv_varlen  # noqa: E402
from nanovllm.kernels.triton_causal_conv import conv_queries, conv_varlen  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
UNUSED_SLOTS = 4  # besides those of the sequences and the scratch slot
# one rounding of the output to bf16 past fp32 sums in another order: to nearest on the GPU (half an ulp, 2^-8
# of the value at most), toward zero in the interpreter (an ulp)
BF16_ROUNDING = 2**-8 if ON_GPU else 2**-7
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-5, "rtol": BF16_ROUNDING}}


def strided(rows: torch.Tensor) -> torch.Tensor:
    """`rows` [..., C] as a column slice of a wider tensor, as the layer's projection output gives it."""
    wide = torch.randn(*rows.shape[:-1], rows.size(-1) + 9, device=rows.device, dtype=rows.dtype)
    wide[..., 5 : 5 + rows.size(-1)] = rows
    return wide[..., 5 : 5 + rows.size(-1)]


def make_inputs(num_seqs: int, channels: int, kernel: int, dtype: torch.dtype, seed: int):
    """Weights [C, K], a state cache [slots + 1, C, K - 1] and distinct slots in no order [seqs], some slots
    unused."""
    torch.manual_seed(seed)
    weight = torch.randn(channels, kernel, device=DEVICE).to(dtype)
    num_slots = num_seqs + UNUSED_SLOTS
    conv_state = torch.randn(num_slots + 1, channels, kernel - 1, device=DEVICE).to(dtype)
    slots = torch.randperm(num_slots, device=DEVICE)[:num_seqs]
    return weight, conv_state, slots


@pytest.fixture
def small_tiles(monkeypatch):
    """Blocks of a few tokens, sequences and channels, so that tiny shapes cross their edges."""
    for name, value in dict(
        TOKENS_BLOCK_T=4, TOKENS_BLOCK_C=32, TOKENS_WARPS=1, STATES_BLOCK_C=32, QUERIES_BLOCK_S=2, QUERIES_BLOCK_C=32
    ).items():
        monkeypatch.setattr(triton_causal_conv, name, value)


def activated(out: torch.Tensor, silu: bool) -> torch.Tensor:
    return F.silu(out) if silu else out


def assert_other_slots_untouched(conv_state: torch.Tensor, before: torch.Tensor, slots: torch.Tensor) -> None:
    others = torch.ones(conv_state.size(0), dtype=torch.bool, device=conv_state.device)
    others[slots] = False
    assert torch.equal(conv_state[others], before[others])


def check_varlen(lengths: list[int], channels: int, kernel: int, dtype: torch.dtype, silu: bool, num_steps: int):
    """conv_varlen on sequences of `lengths` (x a strided view) against the reference in fp32 on the same
    values: outputs within one rounding, states exact."""
    weight, conv_state, slots = make_inputs(len(lengths), channels, kernel, dtype, seed=len(lengths) + kernel)
    x = strided(torch.randn(sum(lengths), channels, device=DEVICE).to(dtype))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    states, before = conv_state[slots], conv_state.clone()
    step_states = want_steps = None
    if num_steps:
        step_states = torch.full((len(lengths), num_steps, channels, kernel - 1), 7.0, device=DEVICE, dtype=dtype)
        want_steps = torch.empty_like(step_states, dtype=torch.float32)
    want_out, want_states = causal_conv_varlen(x.float(), weight.float(), states.float(), cu_seqlens, want_steps)
    out = conv_varlen(x, weight, conv_state, slots, cu_seqlens, step_states, silu=silu)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), activated(want_out, silu), **TOLERANCE[dtype])
    assert torch.equal(conv_state[slots], want_states.to(dtype))
    assert_other_slots_untouched(conv_state, before, slots)
    if num_steps:
        assert torch.equal(step_states, want_steps.to(dtype))


@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", [2, 3, 4])
def test_varlen_equals_the_reference_and_leaves_each_sequence_its_last_inputs(kernel, dtype, silu):
    # one token, shorter than K - 1, exactly K - 1, and a 2-token sequence across a tile's edge (tokens 63, 64)
    lengths = [5, 1, 2, 55, 2, 9, 1, 3]
    check_varlen(lengths, channels=44, kernel=kernel, dtype=dtype, silu=silu, num_steps=3)


def test_varlen_without_step_states():
    check_varlen([3, 1, 7], channels=70, kernel=4, dtype=torch.float32, silu=True, num_steps=0)


@pytest.mark.parametrize("kernel", [3, 4])
def test_varlen_on_tiles_that_sequences_and_channels_cross(small_tiles, kernel):
    # 4-token tiles: sequences start inside them, span several, or end before K - 1 tokens; 70 channels end
    # inside the third 32-channel block
    check_varlen([1, 6, 2, 3, 9, 1], channels=70, kernel=kernel, dtype=torch.bfloat16, silu=True, num_steps=2)


def check_queries(num_seqs: int, channels: int, kernel: int, queries: int, dtype: torch.dtype, silu: bool):
    """conv_queries (x a strided view) against the reference in fp32 on the same values: outputs within one
    rounding; per-query states, and the slots a decode step moves on, exact; a verify step's slots untouched."""
    weight, conv_state, slots = make_inputs(num_seqs, channels, kernel, dtype, seed=queries)
    x = strided(torch.randn(num_seqs, queries, channels, device=DEVICE).to(dtype))
    states, before = conv_state[slots], conv_state.clone()
    step_states = torch.full((num_seqs, queries, channels, kernel - 1), 7.0, device=DEVICE, dtype=dtype)
    want_out, want_steps = causal_conv_queries(x.float(), weight.float(), states.float())
    out = conv_queries(x, weight, conv_state, slots, step_states, silu=silu)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), activated(want_out, silu), **TOLERANCE[dtype])
    assert torch.equal(step_states, want_steps.to(dtype))
    if queries == 1:  # a decode step moves each slot on to the state after its token
        assert torch.equal(conv_state[slots], want_steps[:, -1].to(dtype))
        assert_other_slots_untouched(conv_state, before, slots)
    else:  # a verify step leaves every slot alone
        assert torch.equal(conv_state, before)


@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries", [1, 3])
def test_queries_equal_the_reference(queries, dtype, silu):
    check_queries(num_seqs=4, channels=60, kernel=4, queries=queries, dtype=dtype, silu=silu)


@pytest.mark.parametrize("queries", [1, 2])
def test_queries_on_blocks_that_sequences_and_channels_cross(small_tiles, queries):
    # blocks of 2 sequences, the last one half empty; 70 channels end inside the third 32-channel block
    check_queries(num_seqs=5, channels=70, kernel=4, queries=queries, dtype=torch.bfloat16, silu=True)


def test_a_decode_step_without_step_states_moves_the_slots_on():
    num_seqs, channels, kernel = 3, 40, 3
    weight, conv_state, slots = make_inputs(num_seqs, channels, kernel, torch.float32, seed=5)
    x = torch.randn(num_seqs, 1, channels, device=DEVICE)
    want_out, want_steps = causal_conv_queries(x, weight, conv_state[slots])
    out = conv_queries(x, weight, conv_state, slots, silu=False)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    assert torch.equal(conv_state[slots], want_steps[:, -1])


@pytest.mark.parametrize("kernel", [2, 6, 8])
def test_widths_besides_four_equal_the_reference(small_tiles, kernel):
    # the config allows any width from 2: windows of K taps, states of K - 1 columns and sequences shorter than
    # K - 1 tokens all follow K, across tiles of 4 tokens and blocks of 2 sequences and 32 channels
    check_varlen([1, 6, 2, 3, 9, 1], channels=40, kernel=kernel, dtype=torch.bfloat16, silu=True, num_steps=3)
    for queries in (1, 3):
        check_queries(num_seqs=3, channels=40, kernel=kernel, queries=queries, dtype=torch.bfloat16, silu=True)


def test_a_width_of_six_equals_f_conv1d_over_each_sequence_with_its_state_in_front():
    # beside the reference: the prefill kernel, then a decode step, against F.conv1d over the whole history
    lengths, channels, kernel = [2, 9, 5], 12, 6
    weight, conv_state, slots = make_inputs(len(lengths), channels, kernel, torch.float32, seed=6)
    histories = conv_state[slots].clone()  # [seqs, C, K - 1]: each sequence's inputs before its first token
    x = torch.randn(sum(lengths), channels, device=DEVICE)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    out = conv_varlen(x, weight, conv_state, slots, cu_seqlens, silu=False)
    step = torch.randn(len(lengths), 1, channels, device=DEVICE)
    step_out = conv_queries(step, weight, conv_state, slots, silu=False)
    for i, seq in enumerate(x.split(lengths)):
        inputs = torch.cat((histories[i], seq.T, step[i].T), dim=1)[None]  # [1, C, K - 1 + tokens + 1]
        want = F.conv1d(inputs, weight[:, None], groups=channels)[0].T  # [tokens + 1, C]
        torch.testing.assert_close(out[cu_seqlens[i] : cu_seqlens[i + 1]], want[:-1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step_out[i], want[-1:], atol=1e-5, rtol=1e-5)
        assert torch.equal(conv_state[slots[i]], inputs[0, :, -(kernel - 1) :])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("lengths", [[16384], [9000, 1, 2, 7381], [8] * 2048], ids=["one", "mixed", "short"])
def test_a_large_prefill_on_the_gpu(lengths):
    # Qwen3.5-9B's channels: q and k of 16 heads x 128, v of 32 x 128
    check_varlen(lengths, channels=8192, kernel=4, dtype=torch.bfloat16, silu=True, num_steps=4)


@pytest.mark.gpu
@pytest.mark.parametrize("queries", [1, 4])
def test_a_large_decode_on_the_gpu(queries):
    # 100 sequences: full blocks of sequences and a last one partly empty, over Qwen3.5-9B's channels
    check_queries(num_seqs=100, channels=8192, kernel=4, queries=queries, dtype=torch.bfloat16, silu=True)


@pytest.mark.gpu
def test_a_decode_step_replays_in_a_cuda_graph():
    num_seqs, channels, kernel = 8, 8192, 4
    weight, conv_state, slots = make_inputs(num_seqs, channels, kernel, torch.bfloat16, seed=9)
    x = torch.randn(num_seqs, 1, channels, device=DEVICE, dtype=torch.bfloat16)
    conv_queries(x, weight, conv_state.clone(), slots)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    start = conv_state.clone()
    with torch.cuda.graph(graph):
        out = conv_queries(x, weight, conv_state, slots)
    conv_state.copy_(start)
    x.copy_(torch.randn_like(x))
    graph.replay()
    want_out, want_steps = causal_conv_queries(x.float(), weight.float(), start[slots].float())
    torch.testing.assert_close(out.float(), F.silu(want_out), **TOLERANCE[torch.bfloat16])
    assert torch.equal(conv_state[slots], want_steps[:, -1].to(torch.bfloat16))
