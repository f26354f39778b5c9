"""OutputEstimate: a request's output budget (max_tokens, the context, the cap), the tokens it is expected to
end with, and the share of their budget that finished requests wrote."""

import pytest

from nanovllm.core.output_estimate import CAPPED_OUTPUT, OutputEstimate
from nanovllm.core.request import Request
from nanovllm.sampling_params import SamplingParams


def request(num_prompt, max_tokens, num_output=0):
    req = Request("r", list(range(2, 2 + num_prompt)), SamplingParams(max_tokens=max_tokens), 4)
    for _ in range(num_output):
        req.add_placeholder()
        req.confirm(7)
    return req


@pytest.mark.parametrize(
    "max_tokens, max_model_len, budget",
    [(100, 10_000, 100), (None, 10_000, CAPPED_OUTPUT), (None, 1_000, 990), (50_000, 100_000, CAPPED_OUTPUT)],
)
def test_budget_is_max_tokens_within_the_context_and_the_cap(max_tokens, max_model_len, budget):
    assert OutputEstimate(max_model_len).budget(request(10, max_tokens)) == budget


def test_a_fresh_estimate_expects_every_allowed_token():
    estimate = OutputEstimate(1_000)
    assert estimate.final_tokens(request(10, 100)) == 110
    # never fewer tokens than the request has
    assert estimate.final_tokens(request(10, 100, num_output=5)) == 110


def test_conservativeness_scales_what_is_expected():
    assert OutputEstimate(1_000, conservativeness=0.5).final_tokens(request(10, 100)) == 60
    assert OutputEstimate(1_000, conservativeness=0.0).final_tokens(request(10, 100, num_output=3)) == 13


def test_the_share_follows_what_finished_requests_wrote():
    estimate = OutputEstimate(1_000)
    for _ in range(200):
        estimate.observe(request(10, 100, num_output=20))
    assert estimate.share == pytest.approx(0.2, abs=0.01)
    assert estimate.final_tokens(request(10, 100)) in (30, 31)
    # requests that write their whole budget bring it back up
    for _ in range(200):
        estimate.observe(request(10, 100, num_output=100))
    assert estimate.share == pytest.approx(1.0, abs=0.01)
