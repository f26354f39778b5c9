"""The draft-model proposer on its own: its drafts are the draft model's greedy continuation, a later call
computes only the confirmed tokens its cache lacks (overwriting the K/V of rejected drafts), and its blocks
go back when a request is released or when they run short."""

import pytest

from nanovllm import SamplingParams
from nanovllm.config import Config
from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer

from helpers.draft_models import save_noisy_copy
from helpers.engine_probes import BLOCK, engine
from helpers.prompts import token_ids

PROMPT = [7, 300, 41, 8, 8, 150, 23, 99, 5, 61, 200, 17, 4, 77, 310, 2, 9, 12]  # 18 tokens: two blocks


@pytest.fixture(scope="module")
def draft_dir(qwen3_dir, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny-qwen3-noisy"))
    save_noisy_copy(qwen3_dir, path, noise=0.05)
    return path


@pytest.fixture(scope="module")
def draft_greedy(draft_dir):
    """The draft model's own greedy continuation of a prompt, run as a plain engine."""
    llm = engine(draft_dir)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return lambda prompt: token_ids(llm.generate([prompt], params, use_tqdm=False))[0]


def make_proposer(qwen3_dir: str, draft_dir: str, num_blocks: int = 8) -> DraftModelProposer:
    settings = {"method": "draft_model", "model": draft_dir, "num_speculative_tokens": 3}
    config = Config(qwen3_dir, block_size=BLOCK, max_model_len=256, speculative_config=settings)
    return DraftModelProposer(config, num_blocks)


def record_steps(proposer: DraftModelProposer) -> list[list[int]]:
    """A list that fills with the tokens each draft step computes, per request."""
    steps, execute = [], proposer.runner.execute
    proposer.runner.execute = lambda out: steps.append(out.num_scheduled_tokens) or execute(out)
    return steps


def test_drafts_are_the_draft_models_greedy_tokens_and_reuse_its_cache(qwen3_dir, draft_dir, draft_greedy):
    proposer = make_proposer(qwen3_dir, draft_dir)
    steps = record_steps(proposer)
    expected = draft_greedy(PROMPT)
    assert proposer.propose([PROMPT], [3], ["a"]) == [expected[:3]]
    # the prompt, then one decode step per further draft
    assert steps == [[18], [1], [1]]
    # the target kept the first two drafts and sampled its own token after them
    confirmed = PROMPT + expected[:2] + [5]
    steps.clear()
    assert proposer.propose([confirmed], [3], ["a"]) == [draft_greedy(confirmed)[:3]]
    assert steps == [[1], [1], [1]]  # the kept drafts' K/V were in the cache already
    # the target kept the next draft and rejected the one after it, whose K/V is then written again
    first, second = proposer.caches["a"].drafted
    confirmed = confirmed + [first, 2 if second != 2 else 3]
    steps.clear()
    assert proposer.propose([confirmed], [3], ["a"]) == [draft_greedy(confirmed)[:3]]
    assert steps == [[1], [1], [1]]


def test_requests_of_a_batch_draft_as_many_as_they_may(qwen3_dir, draft_dir, draft_greedy):
    proposer = make_proposer(qwen3_dir, draft_dir)
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:]]
    drafts = proposer.propose(prompts, [3, 1, 2], ["a", "b", "c"])
    assert drafts == [draft_greedy(p)[:k] for p, k in zip(prompts, [3, 1, 2])]


def test_blocks_go_back_on_release_and_a_request_that_does_not_fit_gets_no_drafts(qwen3_dir, draft_dir):
    proposer = make_proposer(qwen3_dir, draft_dir, num_blocks=3)
    # 18 tokens and 2 drafts fed back: 2 blocks
    assert len(proposer.propose([PROMPT], [3], ["a"])[0]) == 3
    assert len(proposer.free_blocks) == 1
    assert proposer.propose([PROMPT + PROMPT], [3], ["b"]) == [[]]
    assert "b" not in proposer.caches and len(proposer.free_blocks) == 1
    proposer.release("a")
    assert len(proposer.free_blocks) == 3 and not proposer.caches
    assert len(proposer.propose([PROMPT + PROMPT], [3], ["b"])[0]) == 3
