"""Request: token, output and block counts with placeholders, the chunk a step computes, and confirmation."""

from nanovllm.core.request import Request, RequestStatus
from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.sampling_params import SamplingParams


def make_req(token_ids, block_size=4, **params):
    return Request("r", list(token_ids), SamplingParams(**params), block_size)


def test_new_request_counts():
    req = make_req(range(10, 20))
    assert req.request_id == "r"
    assert req.num_tokens == req.num_prompt_tokens == 10 and req.num_output_tokens == 0
    assert req.num_placeholders == 0 and req.num_computed_tokens == 0 and req.num_cached_tokens == 0
    assert req.num_new_tokens == 10 and req.num_blocks == 3
    assert req.status == RequestStatus.WAITING and not req.is_finished
    assert req.block_tables == [] and req.finish_reason is None


def test_block_slices_tokens_by_block_size():
    req = make_req(range(10))
    assert [req.block(i) for i in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_single_token_prompt_needs_one_block():
    req = make_req([7], block_size=256)
    assert req.num_blocks == 1 and req.block(0) == [7]


def test_placeholders_count_as_tokens_but_not_as_token_ids():
    req = make_req([1, 2, 3])
    req.add_placeholder()
    req.add_placeholder()
    assert req.num_tokens == 5 and req.num_output_tokens == 2 and req.num_placeholders == 2
    assert req.token_ids == [1, 2, 3] and req.num_prompt_tokens == 3


def test_num_blocks_counts_a_placeholder_that_starts_a_block():
    req = make_req(range(8))
    assert req.num_blocks == 2
    req.add_placeholder()
    assert req.num_blocks == 3 and req.block(2) == []
    req.confirm(99)
    assert req.num_blocks == 3 and req.block(2) == [99]


def test_num_new_tokens_counts_placeholders():
    req = make_req(range(9))
    req.num_computed_tokens = 8
    assert req.num_new_tokens == 1
    req.num_computed_tokens = 9
    req.add_placeholder()
    assert req.num_new_tokens == 1
    req.num_computed_tokens = 10
    req.add_placeholder()
    req.confirm(50)
    assert req.num_new_tokens == 1 and req.num_tokens == 11


def test_chunk_of_confirmed_tokens_starts_at_num_computed():
    req = make_req(range(10, 20))
    assert req.chunk_token_ids(4) == [10, 11, 12, 13]
    req.num_computed_tokens = 8
    assert req.chunk_token_ids(2) == [18, 19]


def test_chunk_marks_a_token_in_flight_as_placeholder():
    req = make_req([1, 2, 3])
    req.num_computed_tokens = 3
    req.add_placeholder()
    assert req.chunk_token_ids(1) == [PLACEHOLDER]
    req.num_computed_tokens = 0
    assert req.chunk_token_ids(4) == [1, 2, 3, PLACEHOLDER]
    req.confirm(40)
    assert req.chunk_token_ids(4) == [1, 2, 3, 40]


def test_confirm_fills_placeholders_oldest_first():
    req = make_req([1, 2, 3])
    req.add_placeholder()
    req.add_placeholder()
    req.confirm(40)
    assert req.token_ids == [1, 2, 3, 40] and req.num_placeholders == 1 and req.num_tokens == 5
    req.num_computed_tokens = 3
    assert req.chunk_token_ids(2) == [40, PLACEHOLDER]
    req.confirm(41)
    assert req.token_ids == [1, 2, 3, 40, 41] and req.num_placeholders == 0 and req.num_tokens == 5
    assert req.num_output_tokens == 2


def test_prompt_list_is_copied():
    prompt = [1, 2, 3]
    req = Request("r", prompt, SamplingParams(), 4)
    prompt.append(4)
    req.add_placeholder()
    req.confirm(9)
    assert prompt == [1, 2, 3, 4] and req.token_ids == [1, 2, 3, 9]


def test_sampling_params_are_recorded():
    req = make_req([1], temperature=0.5, max_tokens=7, ignore_eos=True)
    assert (req.params.temperature, req.params.max_tokens, req.params.ignore_eos) == (0.5, 7, True)
