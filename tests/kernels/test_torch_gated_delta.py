"""The gated delta rule's PyTorch reference against transformers' chunked form (Qwen3.5's), from a given state
and in pieces, the padding a batch of unequal sequences relies on, and the states after each token it records."""

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from nanovllm.kernels.torch_gated_delta import gated_delta_rule

KEY_HEADS, HEADS, DK, DV = 2, 4, 16, 8


def random_inputs(batch: int, steps: int, seed: int = 0):
    """q, k [batch, steps, key heads, DK], v [.., heads, DV], g <= 0 and beta in (0, 1) [batch, steps, heads],
    and a random initial state [batch, heads, DK, DV]."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)
    q, k = randn(batch, steps, KEY_HEADS, DK), randn(batch, steps, KEY_HEADS, DK)
    v = randn(batch, steps, HEADS, DV)
    g = -torch.rand(batch, steps, HEADS, generator=gen) * 2
    beta = torch.rand(batch, steps, HEADS, generator=gen)
    return q, k, v, g, beta, randn(batch, HEADS, DK, DV)


def test_the_recurrence_equals_transformers_chunked_rule_from_a_state():
    q, k, v, g, beta, state = random_inputs(batch=2, steps=70)  # more than one 64-token chunk
    out, final = gated_delta_rule(q, k, v, g, beta, state)
    group = HEADS // KEY_HEADS
    want_out, want_final = torch_chunk_gated_delta_rule(
        q.repeat_interleave(group, 2),
        k.repeat_interleave(group, 2),
        v,
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, want_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, want_final, atol=1e-4, rtol=1e-4)


def test_a_sequence_in_two_pieces_equals_it_whole():
    q, k, v, g, beta, state = random_inputs(batch=3, steps=12, seed=1)
    out, final = gated_delta_rule(q, k, v, g, beta, state)
    first, middle = gated_delta_rule(q[:, :5], k[:, :5], v[:, :5], g[:, :5], beta[:, :5], state)
    second, last = gated_delta_rule(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:], beta[:, 5:], middle)
    torch.testing.assert_close(torch.cat((first, second), 1), out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, final, atol=1e-5, rtol=1e-5)


def test_padding_with_no_decay_and_no_write_leaves_the_state():
    q, k, v, g, beta, state = random_inputs(batch=2, steps=9, seed=2)
    g[:, 6:], beta[:, 6:] = 0.0, 0.0  # the last three steps are padding
    out, final = gated_delta_rule(q, k, v, g, beta, state)
    short_out, short_final = gated_delta_rule(q[:, :6], k[:, :6], v[:, :6], g[:, :6], beta[:, :6], state)
    torch.testing.assert_close(out[:, :6], short_out, atol=0, rtol=0)
    torch.testing.assert_close(final, short_final, atol=0, rtol=0)
    assert not torch.equal(final, state)  # the real steps did write


def test_step_states_hold_the_state_after_each_of_the_first_tokens():
    q, k, v, g, beta, state = random_inputs(batch=2, steps=7, seed=3)
    steps = torch.full((2, 4, HEADS, DK, DV), float("nan"))
    out, final = gated_delta_rule(q, k, v, g, beta, state, steps)
    torch.testing.assert_close(out, gated_delta_rule(q, k, v, g, beta, state)[0], atol=0, rtol=0)
    for t in range(4):
        _, after = gated_delta_rule(q[:, : t + 1], k[:, : t + 1], v[:, : t + 1], g[:, : t + 1], beta[:, : t + 1], state)
        torch.testing.assert_close(steps[:, t], after, atol=1e-6, rtol=1e-6)
    # fewer tokens than recorded positions: only those are written
    short = torch.full((2, 4, HEADS, DK, DV), float("nan"))
    _, short_final = gated_delta_rule(q[:, :2], k[:, :2], v[:, :2], g[:, :2], beta[:, :2], state, short)
    torch.testing.assert_close(short[:, 1], short_final, atol=0, rtol=0)
    assert short[:, 2:].isnan().all()
