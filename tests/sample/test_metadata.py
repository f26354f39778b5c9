"""A step's sampling rows to sampler tensors: the greedy fast path, unused features left out, bans,
seeds, penalties, logit biases; and the logprob entries a step's PendingOutput hands back."""

import pytest
import torch

from nanovllm import SamplingParams
from nanovllm.core.scheduler_output import PromptScoring, SchedulerOutput
from nanovllm.engine.messages import TokenLogprobs
from nanovllm.sample.metadata import SamplingTensors, needs_full_sampler, sampling_tensors, step_sampling
from nanovllm.sample.sampler import Sampler, SamplerOutput
from nanovllm.worker.pending_output import PendingOutput, PromptScores

VOCAB = 50
EOS = (1,)
PROMPT = [3, 4, 5]


def step_for(*params: SamplingParams, completion=(7, 8)) -> SchedulerOutput:
    """A step in which every request (PROMPT, then `completion`) samples: a prefill of the whole prompt,
    or the decode of its newest completion token."""
    n = len(params)
    token_ids = PROMPT + list(completion)
    chunk = token_ids[-1:] if completion else token_ids
    req_ids = [f"r{i}" for i in range(n)]
    with_penalties = any(p.has_penalties for p in params)
    return SchedulerOutput(
        req_ids=req_ids,
        token_ids=[chunk] * n,
        num_computed_tokens=[len(token_ids) - len(chunk)] * n,
        block_tables=[[[0]]] * n,
        samples=[True] * n,
        sampled_req_ids=req_ids,
        sampling_params=list(params),
        num_output_tokens=[len(completion)] * n,
        penalty_token_ids=[(PROMPT, list(completion))] * n if with_penalties else None,
    )


def to_cpu(values: list, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def tensors_for(*params: SamplingParams, **kwargs):
    return sampling_tensors(step_for(*params, **kwargs), VOCAB, EOS, to_cpu)


def test_plain_greedy_batch_takes_the_fast_path():
    assert tensors_for(SamplingParams(temperature=0), SamplingParams(temperature=0, ignore_eos=True)) is None


# one setting each that takes a row off plain temperature sampling, and settings that do not
OFF_PLAIN = [
    dict(top_k=5),
    dict(top_p=0.9),
    dict(min_p=0.1),
    dict(seed=4),
    dict(logit_bias={3: 1.0}),
    dict(presence_penalty=0.5),
    dict(min_tokens=5),
]
PLAIN = [
    dict(),
    dict(temperature=0),
    dict(temperature=1.3, ignore_eos=True),
    dict(temperature=0, seed=4, top_k=5),
    dict(temperature=0, min_tokens=1),
    dict(logprobs=0),
    dict(temperature=0, logprobs=2),
]


@pytest.mark.parametrize("other", PLAIN + OFF_PLAIN)
@pytest.mark.parametrize("first", PLAIN)
def test_the_device_sampled_decode_is_taken_exactly_when_the_tensors_are_temperature_only(first, other):
    step = step_for(SamplingParams(**first), SamplingParams(**other))
    tensors = sampling_tensors(step, VOCAB, EOS, to_cpu)
    expected = tensors is None or tensors.temperature_only
    assert step_sampling(step, EOS).needs_full_sampler == (not expected)
    assert expected == (other in PLAIN)


def test_a_grammar_takes_a_step_off_the_temperature_only_path_on_both_sides():
    step = step_for(SamplingParams(temperature=0.5), SamplingParams(temperature=0))
    assert not step_sampling(step, EOS).needs_full_sampler and step_sampling(step, EOS, grammar=True).needs_full_sampler
    tensors = sampling_tensors(step, VOCAB, EOS, to_cpu)
    assert tensors.temperature_only
    tensors.bitmask = torch.full((2, 2), -1, dtype=torch.int32)
    assert not tensors.temperature_only


def test_one_predicate_names_every_feature_beyond_temperature():
    # both sides call it with every feature by keyword: one left out is an error, not a silent disagreement
    features = ["min_p", "top_k", "top_p", "seeded", "penalties", "logit_bias", "banned", "grammar"]
    assert not needs_full_sampler(**dict.fromkeys(features, False))
    for feature in features:
        assert needs_full_sampler(**{**dict.fromkeys(features, False), feature: True})
    with pytest.raises(TypeError):
        needs_full_sampler(**dict.fromkeys(features[1:], False))
    assert SamplingTensors(temperatures=torch.ones(1)).temperature_only


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
    assert t.positions.tolist() == [len(PROMPT) + 2]  # three prompt tokens and two completion tokens before it


def test_a_seeded_rows_position_skips_requests_that_do_not_sample():
    # a prompt chunk that stops short of the prompt's end runs first and samples nothing
    params = SamplingParams(seed=4)
    out = SchedulerOutput(
        req_ids=["chunk", "decode"],
        token_ids=[[10, 11], [8]],
        num_computed_tokens=[0, 6],
        block_tables=[[[0]], [[1]]],
        samples=[False, True],
        sampled_req_ids=["decode"],
        sampling_params=[params],
        num_output_tokens=[3],
    )
    t = sampling_tensors(out, VOCAB, EOS, to_cpu)
    assert t.seeded_rows.tolist() == [0]
    assert t.positions.tolist() == [7]  # the decode computes position 6 and draws the token at 7


def test_min_tokens_bans_stop_tokens_until_reached():
    # two completion tokens so far: the rows with min_tokens=3 still ban their stop tokens
    t = tensors_for(
        SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[9]),
        SamplingParams(temperature=0, min_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[9]),
    )
    assert t.banned.T.tolist() == [[0, EOS[0]], [0, 9]]


def test_penalties_pad_token_lists_with_the_vocabulary_size():
    t = tensors_for(SamplingParams(temperature=0, repetition_penalty=1.2), SamplingParams(), completion=())
    assert torch.equal(t.penalties.repetition, torch.tensor([1.2, 1.0]))
    assert t.penalties.output_ids.tolist() == [[VOCAB], [VOCAB]]
    assert t.penalties.prompt_ids.tolist() == [PROMPT, PROMPT]


def test_num_logprobs_is_the_most_any_row_asks_for():
    assert tensors_for(SamplingParams(logprobs=2), SamplingParams(logprobs=0)).num_logprobs == 2


def test_logit_bias_alone_leaves_the_fast_path_with_row_token_pairs_and_their_biases():
    t = tensors_for(
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logit_bias={7: 5.0, 3: -100}),
        SamplingParams(temperature=0, logit_bias={2: 0.5}),
    )
    assert t.temperatures is None  # every row is still greedy
    assert t.bias_index.tolist() == [[1, 1, 2], [7, 3, 2]]
    assert t.bias_values.tolist() == [5.0, -100.0, 0.5]
    # on flat logits the argmax is the first token unless a bias lifts another one
    assert Sampler()(torch.zeros(3, VOCAB), t).token_ids.tolist() == [0, 7, 2]


def test_logit_bias_keeps_a_sampled_batch_off_the_temperature_only_path():
    t = tensors_for(SamplingParams(temperature=0.5, logit_bias={4: 1.0}), SamplingParams(temperature=0.5))
    assert t.temperatures.tolist() == [0.5, 0.5] and not t.temperature_only
    assert (t.bias_index.tolist(), t.bias_values.tolist()) == ([[0], [4]], [1.0])


def test_logprob_entries_keep_each_rows_own_count_and_the_chosen_tokens_rank():
    # per row: the chosen token, then the top 2; rows ask for 2, nothing and 0 alternatives
    ids = torch.tensor([[4, 4, 6], [1, 1, 3], [9, 8, 7]])
    values = torch.tensor([[-0.5, -0.5, -2.0], [-1.0, -1.0, -3.0], [-6.0, -1.0, -2.0]])
    ranks = torch.tensor([1, 1, 3])  # row 2 drew its third most likely token
    result = PendingOutput(SamplerOutput(ids[:, 0], ids, values, ranks), [2, None, 0]).result()
    assert result.sampled_token_ids == [[4], [1], [9]]
    # the chosen token stays first even where it is also an alternative: the front end merges them
    assert result.logprobs == [
        [TokenLogprobs([4, 4, 6], [-0.5, -0.5, -2.0], 1)],
        None,
        [TokenLogprobs([9], [-6.0], 3)],
    ]


def test_prompt_scores_are_split_per_request_in_job_order_and_cut_to_each_jobs_count():
    # a step that samples nothing: "a" scores two positions with 1 alternative, "b" one with none
    jobs = [PromptScoring("a", 0, 0, 1, [5, 6]), PromptScoring("b", 1, 2, 0, [7])]
    scores = PromptScores(
        jobs,
        torch.tensor([[5, 3], [6, 6], [7, 2]]),
        torch.tensor([[-2.0, -0.5], [-0.25, -0.25], [-4.0, -0.125]]),
        torch.tensor([2, 1, 9]),
    )
    result = PendingOutput(None, [], scores).result()
    assert (result.sampled_token_ids, result.logprobs) == ([], None)
    assert result.prompt_logprobs == {
        "a": [TokenLogprobs([5, 3], [-2.0, -0.5], 2), TokenLogprobs([6, 6], [-0.25, -0.25], 1)],
        "b": [TokenLogprobs([7], [-4.0], 9)],
    }


def test_a_step_without_logprobs_gives_none():
    result = PendingOutput(SamplerOutput(torch.tensor([4, 1])), [None, None]).result()
    assert (result.sampled_token_ids, result.logprobs) == ([[4], [1]], None)
