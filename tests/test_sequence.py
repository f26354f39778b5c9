"""Sequence: token and block counts, completion tracking, and the compact pickled state sent to workers."""

import pickle

from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.sampling_params import SamplingParams


def make_seq(token_ids, block_size=4, **params):
    return Sequence(list(token_ids), SamplingParams(**params), block_size)


def decode_ready(seq, completion):
    """Put `seq` in the state it has during a decode step after sampling `completion`."""
    for t in completion:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_token(t)
    return seq


def test_new_sequence_counts():
    seq = make_seq(range(10, 20), block_size=4)
    assert len(seq) == seq.num_tokens == seq.num_prompt_tokens == 10
    assert seq.num_computed_tokens == 0 and seq.num_cached_tokens == 0
    assert seq.num_new_tokens == 10
    assert seq.num_blocks == 3
    assert seq.last_token == 19
    assert seq.status == SequenceStatus.WAITING and not seq.is_finished
    assert seq.block_table == [] and seq.completion_token_ids == [] and seq.num_completion_tokens == 0


def test_block_slices_tokens_by_block_size():
    seq = make_seq(range(10), block_size=4)
    assert seq.block(0) == [0, 1, 2, 3]
    assert seq.block(1) == [4, 5, 6, 7]
    assert seq.block(2) == [8, 9]


def test_num_blocks_at_exact_multiple_and_after_crossing():
    seq = make_seq(range(8), block_size=4)
    assert seq.num_blocks == 2
    seq.append_token(99)
    assert seq.num_blocks == 3
    assert seq.block(2) == [99]


def test_single_token_prompt_needs_one_block():
    seq = make_seq([7], block_size=256)
    assert seq.num_blocks == 1 and seq.block(0) == [7] and seq.last_token == 7


def test_append_token_grows_completion():
    seq = make_seq([1, 2, 3], max_tokens=5)
    seq.append_token(40)
    seq.append_token(41)
    assert seq.num_tokens == 5 and len(seq) == 5
    assert seq.last_token == 41
    assert seq.prompt_token_ids == [1, 2, 3]
    assert seq.completion_token_ids == [40, 41]
    assert seq.num_completion_tokens == 2
    assert seq.token_ids == [1, 2, 3, 40, 41]


def test_num_new_tokens_follows_computed_count():
    seq = make_seq(range(9))
    seq.num_computed_tokens = 8
    assert seq.num_new_tokens == 1
    seq.num_computed_tokens = seq.num_tokens
    seq.append_token(5)
    assert seq.num_new_tokens == 1 and seq.num_computed_tokens == 9


def test_prompt_list_is_copied():
    prompt = [1, 2, 3]
    seq = Sequence(prompt, SamplingParams(), 4)
    prompt.append(4)
    seq.append_token(9)
    assert prompt == [1, 2, 3, 4] and seq.token_ids == [1, 2, 3, 9]


def test_sampling_params_are_recorded():
    seq = make_seq([1], temperature=0.5, max_tokens=7, ignore_eos=True)
    assert (seq.params.temperature, seq.params.max_tokens, seq.params.ignore_eos) == (0.5, 7, True)
    assert (seq.output_text, seq.finish_reason, seq.logprobs) == ("", None, [])


def test_seq_ids_are_unique_and_increasing():
    a, b = make_seq([1]), make_seq([1])
    assert b.seq_id > a.seq_id


def test_pickle_before_first_completion_carries_whole_token_list():
    seq = make_seq(range(100, 110))
    seq.block_table = [3, 1, 2]
    restored = pickle.loads(pickle.dumps(seq))
    assert restored.token_ids == list(range(100, 110))
    assert restored.last_token == 109
    assert restored.seq_id == seq.seq_id
    assert restored.num_tokens == 10 and restored.num_prompt_tokens == 10
    assert restored.num_computed_tokens == 0
    assert restored.block_table == [3, 1, 2]


def test_pickle_of_prefill_after_prefix_hit_carries_the_tokens_to_compute():
    # A 9-token prompt whose first two blocks were prefix-cache hits: one token
    # is left to prefill, and no completion token exists yet.
    seq = make_seq(range(100, 109), block_size=4)
    seq.num_computed_tokens = seq.num_cached_tokens = 8
    seq.block_table = [0, 1, 2]
    restored = pickle.loads(pickle.dumps(seq))
    start, end = restored.num_computed_tokens, restored.num_tokens
    assert restored.token_ids[start:end] == [108]
    assert restored.token_ids == seq.token_ids


def test_pickle_of_single_token_prompt_carries_the_token_list():
    restored = pickle.loads(pickle.dumps(make_seq([7])))
    assert restored.token_ids == [7] and restored.last_token == 7 and restored.num_tokens == 1


def test_pickle_during_decode_sends_only_last_token():
    prompt = list(range(1000, 3000))
    seq = decode_ready(make_seq(prompt, block_size=256), [5, 6, 7])
    seq.block_table = list(range(8))
    assert seq.num_computed_tokens == seq.num_tokens - 1
    full = pickle.dumps(make_seq(prompt, block_size=256))
    compact = pickle.dumps(seq)
    assert len(compact) * 20 < len(full)
    restored = pickle.loads(compact)
    assert restored.last_token == 7
    assert restored.num_tokens == 2003 and restored.num_prompt_tokens == 2000
    assert restored.num_computed_tokens == 2002
    assert restored.block_table == list(range(8))
    assert restored.seq_id == seq.seq_id


def test_pickle_after_preemption_carries_whole_list_again():
    seq = decode_ready(make_seq(range(50), block_size=16), [60, 61])
    seq.num_computed_tokens = 0
    restored = pickle.loads(pickle.dumps(seq))
    assert restored.token_ids == list(range(50)) + [60, 61]
    assert restored.last_token == 61
    assert restored.num_tokens == 52 and restored.num_prompt_tokens == 50
    assert restored.num_computed_tokens == 0


def test_pickle_of_recompute_with_one_token_left_still_yields_it():
    # preempted after 3 completion tokens, then all but the last token hit the cache
    seq = make_seq(range(100, 109), block_size=4)
    for t in (200, 201, 202):
        seq.num_computed_tokens = seq.num_tokens
        seq.append_token(t)
    seq.num_computed_tokens = seq.num_tokens - 1
    restored = pickle.loads(pickle.dumps(seq))
    assert restored.new_token_ids == seq.new_token_ids == [202]
