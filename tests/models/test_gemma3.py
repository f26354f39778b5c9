"""Gemma 3 against transformers' own classes on tiny random models: a text model (five sliding layers over
24 tokens to one global, the sliding ones rotated at their own base, the global one scaled) and an image-text
checkpoint run as its language model, greedy tokens across the window, with prefix-cache hits, chunked
prefill, two ranks and the Triton kernels interpreted."""

import pytest

from nanovllm import LLM
from nanovllm.cache.specs import FullAttention, SlidingWindow
from nanovllm.models.model_config import ModelConfig

from helpers.family_checks import ENGINE, GREEDY, assert_cached_prefix_matches_transformers, greedy
from helpers.gemma_models import WINDOW, save_gemma3, save_gemma3_image_text
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory):
    return save_gemma3(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="module")
def gemma3_image_text_dir(tmp_path_factory):
    return save_gemma3_image_text(tmp_path_factory.mktemp("tiny-gemma3-image-text"))


# shorter than the window, around it, and three windows long; 24 new tokens each cross the window
PROMPTS = random_prompts([5, 20, 30, 75])


def test_layer_types_and_rotary_bases_are_read_per_layer(gemma3_dir):
    from transformers import AutoConfig

    config = ModelConfig.from_hf(AutoConfig.from_pretrained(gemma3_dir))
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    # every KV head of the model (two), not those of one rank
    assert config.layer_specs == (SlidingWindow(2, 16, WINDOW),) * 5 + (FullAttention(2, 16),)
    assert config.sliding_rope_parameters == {"rope_type": "default", "rope_theta": 500.0}
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_parameters["rope_theta"] == 10000.0
    assert config.qk_norm and config.attn_logit_softcapping is None and config.final_logit_softcapping is None


def test_greedy_across_the_window_matches_transformers(gemma3_dir):
    assert greedy(gemma3_dir, PROMPTS) == hf_greedy(gemma3_dir, PROMPTS, GREEDY.max_tokens)


def test_chunks_and_a_cached_prefix_match_transformers(gemma3_dir):
    assert_cached_prefix_matches_transformers(gemma3_dir, max_num_batched_tokens=10, max_num_seqs=1)


@pytest.mark.slow
def test_two_ranks_equal_transformers(gemma3_dir):
    expected = hf_greedy(gemma3_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gemma3_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.slow
def test_the_triton_kernels_interpreted_match_transformers(gemma3_dir):
    prompts = PROMPTS[1::2]  # 20 and 75 tokens
    expected = hf_greedy(gemma3_dir, prompts, GREEDY.max_tokens)
    assert greedy(gemma3_dir, prompts, attention_backend="triton", max_num_batched_tokens=32) == expected


def test_an_image_text_checkpoint_runs_as_its_language_model(gemma3_image_text_dir):
    expected = hf_greedy(gemma3_image_text_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gemma3_image_text_dir, PROMPTS) == expected


def test_an_image_in_a_request_is_refused(gemma3_image_text_dir):
    llm = LLM(gemma3_image_text_dir, **ENGINE)
    with pytest.raises(ValueError, match="multi_modal_data is not supported"):
        llm.generate({"prompt_token_ids": PROMPTS[0], "multi_modal_data": {"image": object()}}, GREEDY)
    llm.close()
