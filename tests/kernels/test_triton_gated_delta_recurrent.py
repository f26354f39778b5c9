"""The token-by-token gated delta rule on the state slots, against `gated_delta_rule` run per sequence with the
gate computed as the layer computes it (on the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from nanovllm.kernels.torch_gated_delta import gated_delta_rule  # noqa: E402
from nanovllm.kernels.triton_gated_delta_recurrent import gated_delta_recurrent  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
DTYPES = [torch.float32, torch.bfloat16]
# (key_heads, heads, dk, dv): plain; GQA with a dk and dv of no power of two; GQA with two value blocks, one partial
SHAPES = [(2, 2, 16, 16), (1, 2, 24, 20), (2, 4, 8, 40)]
QWEN35_9B = (16, 32, 128, 128)
NUM_SLOTS = 8  # live slots; slot NUM_SLOTS is the scratch slot
# the same arithmetic in fp32 on both sides, summed in another order: a few roundings apart
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _inputs(tokens: int, shape: tuple[int, int, int, int], dtype: torch.dtype, seed: int = 0):
    """q, k, v, a, b as strided views of one projection output [tokens, q | k | v | b | a], A_log and dt_bias,
    and a random state cache [NUM_SLOTS + 1, heads, dk, dv]."""
    key_heads, heads, dk, dv = shape
    torch.manual_seed(seed)
    projected = torch.randn(tokens, 2 * key_heads * dk + heads * dv + 2 * heads, device=DEVICE).to(dtype)
    q, k, v, b, a = projected.split([key_heads * dk, key_heads * dk, heads * dv, heads, heads], dim=-1)
    a.mul_(4)  # decays from next to none to a state all but wiped
    if tokens:  # softplus's linear range above 20, and a tiny softplus far below 0
        a[0, 0], a[-1, -1] = 25.0, -30.0
    A_log = torch.empty(heads, device=DEVICE).uniform_(0, 16).log()  # A in (1, 16), as Qwen3.5 initialises it
    dt_bias = torch.randn(heads, device=DEVICE)
    state = torch.randn(NUM_SLOTS + 1, heads, dk, dv, device=DEVICE)
    return (
        q.view(tokens, key_heads, dk),
        k.view(tokens, key_heads, dk),
        v.view(tokens, heads, dv),
        a,
        b,
        A_log,
        dt_bias,
        state,
    )


def _reference(q, k, v, a, b, A_log, dt_bias, state, slots, lengths, num_steps=0):
    """Outputs [tokens, heads, dv], each sequence's final state [seqs, heads, dk, dv] and, with num_steps, its
    states after each of its first num_steps tokens [seqs, num_steps, heads, dk, dv], the last past its end."""
    g = -A_log.exp() * F.softplus(a.float() + dt_bias)  # as GatedDeltaNet.forward
    beta = b.float().sigmoid()
    outs, finals, steps, start = [], [], [], 0
    for slot, length in zip(slots.tolist(), lengths):
        seq = slice(start, start + length)
        recorded = torch.empty(1, num_steps, *state.shape[1:], device=DEVICE)
        out, final = gated_delta_rule(
            *(t[None, seq] for t in (q, k, v, g, beta)), state[slot : slot + 1], recorded if num_steps else None
        )
        recorded[:, length:] = final[:, None]
        outs.append(out[0])
        finals.append(final[0])
        steps.append(recorded[0])
        start += length
    return torch.cat(outs), torch.stack(finals), torch.stack(steps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_decode_updates_its_slots_in_place(shape, dtype):
    q, k, v, a, b, A_log, dt_bias, state = _inputs(3, shape, dtype)
    slots = torch.tensor([5, 0, 2], device=DEVICE)
    want, final, _ = _reference(q, k, v, a, b, A_log, dt_bias, state, slots, [1, 1, 1])
    before = state.clone()

    out = gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state, slots)

    assert out.shape == v.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, want, **TOLERANCE)
    torch.testing.assert_close(state[slots], final, **TOLERANCE)
    others = [slot for slot in range(NUM_SLOTS + 1) if slot not in slots.tolist()]  # the scratch slot among them
    assert torch.equal(state[others], before[others])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_writes_the_state_after_each_query_and_leaves_the_slots(shape, dtype):
    queries = 3
    q, k, v, a, b, A_log, dt_bias, state = _inputs(2 * queries, shape, dtype, seed=1)
    slots = torch.tensor([3, NUM_SLOTS], device=DEVICE)  # a live slot and a padded row's scratch slot
    want, _, want_steps = _reference(q, k, v, a, b, A_log, dt_bias, state, slots, [queries] * 2, queries)
    before = state.clone()
    step_states = torch.full((2, queries, *state.shape[1:]), float("nan"), device=DEVICE)

    out = gated_delta_recurrent(
        q, k, v, a, b, A_log, dt_bias, state, slots, queries_per_seq=queries, step_states=step_states, write_state=False
    )

    torch.testing.assert_close(out, want, **TOLERANCE)
    torch.testing.assert_close(step_states, want_steps, **TOLERANCE)
    assert torch.equal(state, before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_varlen_writes_its_slots_and_the_first_states_of_each_sequence(shape, dtype):
    lengths, num_steps = [1, 5, 3], 4  # a sequence longer than the step states, two shorter
    q, k, v, a, b, A_log, dt_bias, state = _inputs(sum(lengths), shape, dtype, seed=2)
    slots = torch.tensor([7, 1, 4], device=DEVICE)
    cu_seqlens = torch.tensor([0, 1, 6, 9], dtype=torch.int32, device=DEVICE)
    want, final, want_steps = _reference(q, k, v, a, b, A_log, dt_bias, state, slots, lengths, num_steps)
    before = state.clone()
    step_states = torch.full((3, num_steps, *state.shape[1:]), float("nan"), device=DEVICE)

    out = gated_delta_recurrent(
        q, k, v, a, b, A_log, dt_bias, state, slots, cu_seqlens=cu_seqlens, step_states=step_states
    )

    torch.testing.assert_close(out, want, **TOLERANCE)
    torch.testing.assert_close(state[slots], final, **TOLERANCE)
    torch.testing.assert_close(step_states, want_steps, **TOLERANCE)
    others = [slot for slot in range(NUM_SLOTS + 1) if slot not in slots.tolist()]
    assert torch.equal(state[others], before[others])


@pytest.mark.gpu
@pytest.mark.parametrize("num_seqs", [1, 64, 256])
def test_decode_at_the_qwen35_9b_shape(num_seqs):
    q, k, v, a, b, A_log, dt_bias, state = _inputs(num_seqs, QWEN35_9B, torch.bfloat16)
    state = torch.randn(num_seqs + 1, *state.shape[1:], device=DEVICE)
    slots = torch.randperm(num_seqs, device=DEVICE)
    want, final, _ = _reference(q, k, v, a, b, A_log, dt_bias, state, slots, [1] * num_seqs)
    scratch = state[num_seqs].clone()

    out = gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state, slots)

    torch.testing.assert_close(out, want, **TOLERANCE)
    torch.testing.assert_close(state[slots], final, **TOLERANCE)
    assert torch.equal(state[num_seqs], scratch)


@pytest.mark.gpu
def test_verify_at_the_qwen35_9b_shape():
    num_seqs, queries = 64, 4
    q, k, v, a, b, A_log, dt_bias, state = _inputs(num_seqs * queries, QWEN35_9B, torch.bfloat16, seed=3)
    state = torch.randn(num_seqs + 1, *state.shape[1:], device=DEVICE)
    slots = torch.randperm(num_seqs, device=DEVICE)
    want, _, want_steps = _reference(q, k, v, a, b, A_log, dt_bias, state, slots, [queries] * num_seqs, queries)
    before = state.clone()
    step_states = torch.empty(num_seqs, queries, *state.shape[1:], device=DEVICE)

    out = gated_delta_recurrent(
        q, k, v, a, b, A_log, dt_bias, state, slots, queries_per_seq=queries, step_states=step_states, write_state=False
    )

    torch.testing.assert_close(out, want, **TOLERANCE)
    torch.testing.assert_close(step_states, want_steps, **TOLERANCE)
    assert torch.equal(state, before)
