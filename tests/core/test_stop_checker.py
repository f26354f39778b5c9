"""Token-level stopping rules: max_tokens, max_model_len, end-of-sequence and stop tokens, min_tokens,
and whether a request with tokens in flight needs another step."""

from nanovllm import SamplingParams
from nanovllm.core.request import Request
from nanovllm.core.stop_checker import StopChecker

EOS = 1
BLOCK_SIZE = 16


def make_request(prompt, **params) -> Request:
    return Request("r", list(prompt), SamplingParams(temperature=0, **params), BLOCK_SIZE)


def run(completion, prompt=(5,), max_model_len=1000, **params) -> tuple[str | None, list[int]]:
    """Sample and confirm `completion` token by token, as the scheduler does, until the checker ends
    the request; returns its finish reason and the completion tokens it got."""
    req = make_request(prompt, **params)
    checker = StopChecker((EOS,), max_model_len)
    reason = None
    for token_id in completion:
        req.add_placeholder()
        req.confirm(token_id)
        reason = checker.finish_reason(req)
        if reason is not None:
            break
    return reason, req.token_ids[req.num_prompt_tokens :]


def test_runs_to_max_tokens_with_reason_length():
    assert run([6, 7, 8, 9], max_tokens=3) == ("length", [6, 7, 8])


def test_max_model_len_ends_with_reason_length():
    # two prompt tokens and a limit of four leave room for two completion tokens
    assert run([7, 8, 9], prompt=(5, 6), max_model_len=4) == ("length", [7, 8])


def test_eos_stops_with_reason_stop():
    assert run([6, EOS, 7]) == ("stop", [6, EOS])


def test_ignore_eos_runs_past_it():
    assert run([6, EOS, 7], ignore_eos=True, max_tokens=3) == ("length", [6, EOS, 7])


def test_stop_token_ids_stop_with_reason_stop():
    assert run([6, 9, 7, 8], stop_token_ids=[7]) == ("stop", [6, 9, 7])


def test_a_stop_token_that_is_also_the_last_allowed_token_reports_stop():
    assert run([6, 9, 7], stop_token_ids=[7], max_tokens=3) == ("stop", [6, 9, 7])


def test_min_tokens_defers_every_kind_of_stop_token():
    completion = [EOS, 7, 9, 10, 11]
    assert run(completion, min_tokens=3, stop_token_ids=[7], max_tokens=5) == ("length", completion)
    # from the min_tokens-th token on, a stop token stops again
    assert run([9, 10, EOS, 11], min_tokens=3) == ("stop", [9, 10, EOS])
    assert run([9, 10, 7, 11], min_tokens=3, stop_token_ids=[7]) == ("stop", [9, 10, 7])


def test_has_all_tokens_counts_tokens_still_in_flight():
    checker = StopChecker((EOS,), max_model_len=1000)
    req = make_request([5, 6, 7], max_tokens=2)
    req.add_placeholder()
    assert not checker.has_all_tokens(req)
    req.add_placeholder()
    # both allowed tokens are being sampled: no step needs to run the request again
    assert checker.has_all_tokens(req)


def test_has_all_tokens_counts_a_token_in_flight_against_max_model_len():
    checker = StopChecker((EOS,), max_model_len=4)
    req = make_request([5, 6, 7])
    assert not checker.has_all_tokens(req)
    req.add_placeholder()
    assert checker.has_all_tokens(req)


def test_finish_reason_counts_only_confirmed_tokens():
    checker = StopChecker((EOS,), max_model_len=1000)
    req = make_request([5], max_tokens=2)
    req.add_placeholder()
    req.add_placeholder()
    req.confirm(6)
    # the second token is still in flight: the request is not done before it is read back
    assert checker.finish_reason(req) is None
    req.confirm(7)
    assert checker.finish_reason(req) == "length"
