"""Gemma 2 against transformers' own Gemma2ForCausalLM on a tiny random model whose sliding layers attend
over 24 tokens: greedy tokens across the window, with prefix-cache hits, chunked prefill and two ranks, and
the soft-capped logits' log-probabilities."""

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config

from helpers.family_checks import ENGINE, GREEDY, assert_cached_prefix_matches_transformers
from helpers.gemma_models import WINDOW, save_gemma2
from helpers.hf_reference import hf_greedy, hf_logprobs
from helpers.prompts import random_prompts, token_ids


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory):
    return save_gemma2(tmp_path_factory.mktemp("tiny-gemma2"))


def generate(model_dir, prompts, params=GREEDY, **engine):
    llm = LLM(model_dir, **{**ENGINE, **engine})
    outputs = llm.generate(prompts, params, use_tqdm=False)
    llm.close()
    return outputs


# shorter than the window, around it, and three windows long; 24 new tokens each cross the window
PROMPTS = random_prompts([5, 20, 30, 75])


def test_greedy_across_the_window_matches_transformers(gemma2_dir):
    assert token_ids(generate(gemma2_dir, PROMPTS)) == hf_greedy(gemma2_dir, PROMPTS, GREEDY.max_tokens)


def test_chunks_that_split_a_prompt_inside_the_window_match_transformers(gemma2_dir):
    # 10-token chunks: later chunks attend over the window partly in the cache, partly in themselves
    outputs = generate(gemma2_dir, PROMPTS, max_num_batched_tokens=10, max_num_seqs=1)
    assert token_ids(outputs) == hf_greedy(gemma2_dir, PROMPTS, GREEDY.max_tokens)


def test_prompts_with_a_cached_prefix_match_transformers(gemma2_dir):
    assert_cached_prefix_matches_transformers(gemma2_dir)


@pytest.mark.slow
def test_two_ranks_equal_one(gemma2_dir):
    expected = hf_greedy(gemma2_dir, PROMPTS, GREEDY.max_tokens)
    assert token_ids(generate(gemma2_dir, PROMPTS, tensor_parallel_size=2, device="cpu")) == expected


def test_logprobs_of_the_soft_capped_logits_match_transformers(gemma2_dir):
    # greedy choices do not see the final soft-cap (tanh keeps the order); log-probabilities do
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3)
    prompt = PROMPTS[3]
    [output] = generate(gemma2_dir, [prompt], params)
    completion = output.outputs[0].token_ids
    want = hf_logprobs(gemma2_dir, prompt, completion)  # [len(completion), vocab]
    for step, (token, logprobs) in enumerate(zip(completion, output.outputs[0].logprobs)):
        assert logprobs[token].logprob == pytest.approx(want[step, token].item(), abs=1e-4)


def test_flash_attn_which_cannot_soft_cap_is_refused_at_load(gemma2_dir, monkeypatch):
    monkeypatch.setattr(Config, "_resolve_attention_backend", lambda self: "flash_attn")  # as on a GPU with it
    with pytest.raises(ValueError, match=r"attention_backend='flash_attn' cannot soft-cap .*attn_logit_softcapping 4"):
        Config(gemma2_dir, max_model_len=WINDOW)


@pytest.mark.slow
def test_the_triton_kernels_interpreted_match_transformers(gemma2_dir):
    # the Triton backend's window and soft-cap switches inside the model, under the interpreter on the CPU
    prompts = PROMPTS[1::2]  # 20 and 75 tokens
    outputs = generate(gemma2_dir, prompts, attention_backend="triton", max_num_batched_tokens=32)
    assert token_ids(outputs) == hf_greedy(gemma2_dir, prompts, GREEDY.max_tokens)
