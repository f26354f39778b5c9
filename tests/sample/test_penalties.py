"""Penalties: the definitions, and equality with transformers' repetition penalty processor."""

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from nanovllm.sample.penalties import PenaltyTensors, apply_penalties, token_counts

VOCAB = 10
PAD = VOCAB


def penalties(
    repetition=(1.0, 1.0),
    frequency=(0.0, 0.0),
    presence=(0.0, 0.0),
    prompt=((2, 3, PAD), (5, 5, 5)),
    output=((3, 3, 7), (PAD, PAD, PAD)),
) -> PenaltyTensors:
    return PenaltyTensors(
        torch.tensor(repetition),
        torch.tensor(frequency),
        torch.tensor(presence),
        torch.tensor(prompt),
        torch.tensor(output),
    )


def test_token_counts_ignore_padding():
    counts = token_counts(torch.tensor([[3, 3, 7, PAD], [PAD, PAD, PAD, PAD]]), VOCAB)
    assert counts[0].tolist() == [0, 0, 0, 2, 0, 0, 0, 1, 0, 0]
    assert counts[1].sum() == 0


def test_repetition_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    logits = torch.tensor([[1.0, -1.0, 2.0, -2.0, 4.0, 0.5, -0.5, 3.0, 1.0, 1.0]] * 2)
    out = apply_penalties(logits, penalties(repetition=(2.0, 0.5)))
    # row 0 saw 2, 3 (prompt) and 3, 7 (output); row 1 saw only 5
    expected0 = logits[0].clone()
    expected0[[2, 7]] /= 2.0
    expected0[3] *= 2.0
    expected1 = logits[1].clone()
    expected1[5] /= 0.5
    assert torch.equal(out, torch.stack([expected0, expected1]))


def test_frequency_and_presence_count_only_the_output():
    logits = torch.zeros(2, VOCAB)
    out = apply_penalties(logits, penalties(frequency=(0.5, 0.5), presence=(1.5, 1.5)))
    expected = torch.zeros(2, VOCAB)
    expected[0, 3] = -(0.5 * 2 + 1.5)
    expected[0, 7] = -(0.5 * 1 + 1.5)
    assert torch.equal(out, expected)


def test_negative_penalties_reward_repeats():
    out = apply_penalties(torch.zeros(2, VOCAB), penalties(frequency=(-1.0, 0.0), presence=(-0.5, 0.0)))
    assert out[0, 3] == 2.5 and out[0, 7] == 1.5 and out[0, 2] == 0


def test_repetition_equals_transformers_processor():
    torch.manual_seed(0)
    vocab = 300
    logits = torch.randn(3, vocab) * 3
    prompts = torch.randint(0, vocab, (3, 20))
    outputs = torch.randint(0, vocab, (3, 15))
    values = [1.3, 0.7, 1.0]
    mine = apply_penalties(
        logits, PenaltyTensors(torch.tensor(values), torch.zeros(3), torch.zeros(3), prompts, outputs)
    )
    for row, value in enumerate(values):
        # transformers looks at every id so far: prompt then output
        ids = torch.cat([prompts[row], outputs[row]]).unsqueeze(0)
        theirs = RepetitionPenaltyLogitsProcessor(penalty=value)(ids, logits[row : row + 1].clone())
        assert torch.allclose(mine[row], theirs[0])
