"""The chunked gated delta rule of a prefill step (Triton) against the token-by-token PyTorch reference, run per
sequence from the same initial state: sequences shorter, as long as and longer than a chunk in one call, slots in
any order (the others untouched), grouped key heads, head sizes that are not powers of two, strided inputs, fp32
and bf16, mild and strong decays (on the CPU under the Triton interpreter, which conftest selects, with 16-token
chunks); on the GPU also Qwen3.5-9B's layer over a 16k-token prompt and over 64 prompts of 256 tokens."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from nanovllm.kernels.torch_gated_delta import gated_delta_rule  # noqa: E402
from nanovllm.kernels.triton_gated_delta_chunked import CHUNK, gated_delta_chunked  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
BT = CHUNK if ON_GPU else 16  # tokens per chunk


def random_step(lengths, key_heads, heads, dk, dv, dtype, decay, seed=0):
    """The inputs of a varlen step: q, k, v as views of one wider [tokens, channels] tensor and a, b of another
    (as the fused projection leaves them), A_log, dt_bias, a state cache with three slots more than sequences and
    the sequences' slots out of order. `decay`: "mild" (g > -0.3), "strong" (g down to about -10 and past it) or
    "mixed" (per head, from almost none to strong)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    widths = [key_heads * dk, key_heads * dk, heads * dv]
    mixed = torch.randn(tokens, sum(widths) + 8, generator=gen).to(dtype)
    q, k, v = mixed[:, : sum(widths)].split(widths, dim=-1)
    projected = torch.randn(tokens, 2 * heads + 3, generator=gen)
    b, a = (projected * 1.5).to(dtype)[:, : 2 * heads].split([heads, heads], dim=-1)
    rates = {
        "mild": torch.rand(heads, generator=gen) * 0.04 + 0.01,
        "strong": torch.rand(heads, generator=gen) * 2 + 2,
        "mixed": 10 ** (torch.rand(heads, generator=gen) * 4 - 3),
    }[decay]
    dt_bias = torch.full((heads,), 0.0 if decay == "mild" else 0.5)
    state = torch.randn(len(lengths) + 3, heads, dk, dv, generator=gen)
    slots = torch.randperm(len(lengths) + 3, generator=gen)[: len(lengths)]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    tensors = (
        q.view(tokens, key_heads, dk),
        k.view(tokens, key_heads, dk),
        v.view(tokens, heads, dv),
        a,
        b,
        rates.log(),
        dt_bias,
        state,
        slots,
        cu_seqlens,
    )
    return tuple(t.to(DEVICE) for t in tensors)


def gates(a, b, A_log, dt_bias):
    """The decay g and write strength beta [tokens, heads] in fp32, as the layer computes them."""
    return -A_log.exp() * F.softplus(a.float() + dt_bias), b.float().sigmoid()


def reference(q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens):
    """`gated_delta_rule` per sequence from its slot's state: the outputs and the state cache after the step."""
    g, beta = gates(a, b, A_log, dt_bias)
    outs, states = [], state.clone()
    for seq, slot in enumerate(slots.tolist()):
        rows = slice(cu_seqlens[seq].item(), cu_seqlens[seq + 1].item())
        out, final = gated_delta_rule(*(x[rows][None] for x in (q, k, v, g, beta)), state[slot][None])
        outs.append(out[0])
        states[slot] = final[0]
    return torch.cat(outs), states


def run(q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens):
    """gated_delta_chunked on a copy of the state cache: the outputs and the cache after the step."""
    states = state.clone()
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    out = gated_delta_chunked(q, k, v, a, b, A_log, dt_bias, states, slots, cu_seqlens, int(lengths.max()), BT)
    return out, states


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


# (key heads, heads, dk, dv): grouped heads with head sizes that are not powers of two, and plain ones
SHAPES = [(1, 2, 24, 20), (2, 2, 16, 32)]


@pytest.mark.parametrize("decay", ["mild", "strong"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_the_recurrence_from_each_sequences_slot(shape, dtype, decay):
    lengths = [1, BT - 1, BT, BT + 1, 5 * BT // 2]
    step = random_step(lengths, *shape, dtype, decay)
    a, b, A_log, dt_bias, state, slots = step[3:9]
    g, _ = gates(a, b, A_log, dt_bias)
    assert g.min() < -8 if decay == "strong" else g.min() > -0.3
    want_out, want_state = reference(*step)
    got_out, got_state = run(*step)
    assert got_out.dtype == torch.float32 and got_out.shape == want_out.shape
    # exact products of bf16 halves (2^-17 of each fp32 operand) accumulated in fp32; the unused slots untouched
    torch.testing.assert_close(got_out, want_out, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(got_state, want_state, atol=2e-4, rtol=2e-4)
    unused = [slot for slot in range(state.size(0)) if slot not in slots.tolist()]
    assert torch.equal(got_state[unused], state[unused])


def test_a_subset_of_sequences_runs_alone_leaving_the_others_rows_and_slots():
    """With `seqs`, the chosen sequences' outputs and states are those of the whole step, and the others' slots
    keep their states; none chosen runs nothing."""
    lengths = [1, BT + 3, 1, 2 * BT]
    q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens = random_step(lengths, 1, 2, 16, 8, torch.float32, "mild")
    want_out, want_state = reference(q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens)
    chosen = torch.tensor([1, 3], device=DEVICE)
    states = state.clone()
    got = gated_delta_chunked(q, k, v, a, b, A_log, dt_bias, states, slots, cu_seqlens, 2 * BT, BT, seqs=chosen)
    rows = torch.cat([torch.arange(cu_seqlens[i], cu_seqlens[i + 1]) for i in (1, 3)]).to(DEVICE)
    torch.testing.assert_close(got[rows], want_out[rows], atol=2e-4, rtol=2e-4)
    chosen_slots, other_slots = slots[chosen], slots[[0, 2]]
    torch.testing.assert_close(states[chosen_slots], want_state[chosen_slots], atol=2e-4, rtol=2e-4)
    assert torch.equal(states[other_slots], state[other_slots])
    none = gated_delta_chunked(q, k, v, a, b, A_log, dt_bias, states, slots, cu_seqlens, 2 * BT, BT, seqs=chosen[:0])
    assert none.shape == want_out.shape and torch.equal(states[other_slots], state[other_slots])


def test_a_sequence_in_two_steps_equals_it_whole():
    """The state the first step leaves in the slot is where the second starts, whatever the chunks' bounds."""
    lengths = [2 * BT + 5, 3]
    q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens = random_step(lengths, 1, 2, 16, 16, torch.float32, "mild")
    whole_out, whole_state = run(q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens)
    split = BT + 3
    first = (q[:split], k[:split], v[:split], a[:split], b[:split])
    second = (q[split:], k[split:], v[split:], a[split:], b[split:])
    head_cu = torch.tensor([0, split], dtype=torch.int32, device=DEVICE)
    tail_cu = cu_seqlens - split
    tail_cu[0] = 0
    first_out, middle = run(*first, A_log, dt_bias, state, slots[:1], head_cu)
    second_out, final = run(*second, A_log, dt_bias, middle, slots, tail_cu)
    torch.testing.assert_close(torch.cat((first_out, second_out)), whole_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, whole_state, atol=1e-4, rtol=1e-4)


def test_refuses_a_chunk_that_is_not_four_blocks():
    step = random_step([3], 1, 2, 16, 16, torch.float32, "mild")
    with pytest.raises(ValueError):
        gated_delta_chunked(*step, 3, 18)


@pytest.mark.skipif(not ON_GPU, reason="Qwen3.5-9B's layer over long prompts needs a GPU")
@pytest.mark.parametrize("lengths", [[16384], [256] * 64], ids=["16k", "64x256"])
def test_qwen35_9b_layer_over_long_prompts(lengths):
    """Within 1e-3 of the fp32 recurrence over 16k tokens: heads from almost no decay (the state remembers the
    whole prompt) to strong."""
    step = random_step(lengths, 16, 32, 128, 128, torch.bfloat16, "mixed")
    got_out, got_state = run(*step)
    # sequences of one length: the reference runs them as one batch
    q, k, v, a, b, A_log, dt_bias, state, slots, _ = step
    g, beta = gates(a, b, A_log, dt_bias)
    batch = (len(lengths), lengths[0])
    want_out, final = gated_delta_rule(*(x.view(*batch, *x.shape[1:]) for x in (q, k, v, g, beta)), state[slots])
    want_state = state.clone()
    want_state[slots] = final
    assert relative_error(got_out, want_out.flatten(0, 1)) < 1e-3
    assert relative_error(got_state, want_state) < 1e-3
