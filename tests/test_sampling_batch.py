"""Sequences to sampler tensors: the greedy fast path, unused features left out, bans, seeds, logprobs."""

import torch

from nanovllm import SamplingParams
from nanovllm.engine.sampling_batch import logprob_dicts, sampling_tensors
from nanovllm.engine.sequence import Sequence
from nanovllm.layers.sampler import SamplerOutput

VOCAB = 50
EOS = (1,)


def seqs_for(*params: SamplingParams, completion=(7, 8)) -> list[Sequence]:
    seqs = []
    for p in params:
        seq = Sequence([3, 4, 5], p, 16)
        for token_id in completion:
            seq.append_token(token_id)
        seqs.append(seq)
    return seqs


def tensors_for(*params: SamplingParams, **kwargs):
    return sampling_tensors(seqs_for(*params, **kwargs), VOCAB, EOS, lambda v, dtype: torch.tensor(v, dtype=dtype))


def test_plain_greedy_batch_takes_the_fast_path():
    assert tensors_for(SamplingParams(temperature=0), SamplingParams(temperature=0, ignore_eos=True)) is None


def test_unused_features_stay_none():
    t = tensors_for(SamplingParams(temperature=0.5), SamplingParams(temperature=0))
    assert t.temperatures.tolist() == [0.5, 0.0]
    assert (t.min_p, t.top_k, t.top_p, t.seeded_rows, t.penalties, t.banned, t.num_logprobs) == (None,) * 7


def test_per_row_values_with_off_rows_neutral():
    t = tensors_for(SamplingParams(top_k=5, top_p=0.5, min_p=0.1), SamplingParams(top_k=1000), SamplingParams())
    assert t.top_k.tolist() == [5, VOCAB, VOCAB]
    assert t.top_p.tolist() == [0.5, 1.0, 1.0]
    assert torch.equal(t.min_p, torch.tensor([0.1, 0.0, 0.0]))


def test_seeded_rows_carry_the_new_tokens_position():
    t = tensors_for(SamplingParams(), SamplingParams(seed=-3), SamplingParams(seed=9, temperature=0))
    assert t.seeded_rows.tolist() == [1]
    assert t.seeds.tolist() == [(-3) % (1 << 63)]
    assert t.positions.tolist() == [5]  # three prompt tokens and two completion tokens before it


def test_min_tokens_bans_stop_tokens_until_reached():
    t = tensors_for(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9]),
                    SamplingParams(temperature=0, min_tokens=3, ignore_eos=True),
                    SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[9]))
    assert t.banned.T.tolist() == [[0, 1], [0, 9]]


def test_penalties_pad_token_lists_with_the_vocabulary_size():
    t = tensors_for(SamplingParams(temperature=0, repetition_penalty=1.2), SamplingParams(), completion=())
    assert torch.equal(t.penalties.repetition, torch.tensor([1.2, 1.0]))
    assert t.penalties.output_ids.tolist() == [[VOCAB], [VOCAB]]
    assert t.penalties.prompt_ids.tolist() == [[3, 4, 5], [3, 4, 5]]


def test_logprob_dicts_keep_each_rows_own_count():
    seqs = seqs_for(SamplingParams(logprobs=2), SamplingParams(), SamplingParams(logprobs=0))
    assert tensors_for(SamplingParams(logprobs=2), SamplingParams(logprobs=0)).num_logprobs == 2
    ids = torch.tensor([[4, 4, 6], [1, 2, 3], [9, 8, 7]])
    # the chosen token 4 is also the top alternative: one entry
    values = torch.tensor([[-0.5, -0.5, -2.0], [-1.0, -2.0, -3.0], [-6.0, -7.0, -8.0]])
    out = logprob_dicts(seqs, SamplerOutput(ids[:, 0], ids, values))
    assert out == [{4: -0.5, 6: -2.0}, None, {9: -6.0}]
