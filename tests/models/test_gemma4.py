"""Gemma 4 against transformers' own classes on tiny random models: a dense one (five sliding layers of 4 KV
heads of 16 to one global of 2 KV heads of 32 whose V is its K projection's, rotated by proportional
rotary), one whose last two layers read earlier layers' K/V with per-layer input embeddings, one with
experts beside each dense MLP, and a multimodal checkpoint run as its language model; greedy tokens across
the sliding window, with prefix-cache hits, a second turn, chunked prefill, preemption, two ranks and the
Triton kernels interpreted."""

import pytest

from nanovllm import LLM
from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, SharedKV, SlidingWindow
from nanovllm.models.model_config import ModelConfig
from nanovllm.utils.parallel import check_divisible

from helpers.engine_probes import engine, record_preemptions
from helpers.family_checks import (
    ENGINE,
    GREEDY,
    assert_cached_prefix_matches_transformers,
    assert_preempted_requests_match_transformers,
    assert_second_turn_matches_transformers,
    greedy,
)
from helpers.gemma_models import (
    WINDOW,
    save_gemma4_dense,
    save_gemma4_moe,
    save_gemma4_multimodal,
    save_gemma4_shared_kv,
)
from helpers.hf_reference import hf_greedy
from helpers.prompts import random_prompts

SAVERS = {"dense": save_gemma4_dense, "shared_kv": save_gemma4_shared_kv, "moe": save_gemma4_moe}

# shorter than the window, around it, and three windows long; 24 new tokens each cross the window
PROMPTS = random_prompts([5, 20, 30, 75])


@pytest.fixture(scope="module", params=list(SAVERS))
def gemma4_dir(request, tmp_path_factory):
    return SAVERS[request.param](tmp_path_factory.mktemp(f"tiny-gemma4-{request.param}"))


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory):
    return save_gemma4_multimodal(tmp_path_factory.mktemp("tiny-gemma4-multimodal"))


def _config(model_dir: str) -> ModelConfig:
    from transformers import AutoConfig

    return ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir))


def test_each_layer_kind_gets_its_shape_rotary_and_cache(tmp_path):
    dense = _config(save_gemma4_dense(tmp_path / "dense"))
    # sliding layers: 4 KV heads of 16; the global one: 2 of 32 (num_global_key_value_heads, global_head_dim)
    assert dense.layer_specs == (SlidingWindow(4, 16, WINDOW),) * 5 + (FullAttention(2, 32),)
    assert dense.gemma4.attention_k_eq_v and dense.gemma4.kv_sources == (None,) * 6
    assert dense.rope_parameters == {
        "rope_type": "proportional",
        "rope_theta": 1000000.0,
        "partial_rotary_factor": 0.25,
    }
    assert dense.sliding_rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert dense.attention_scale == 1.0 and dense.final_logit_softcapping == 5.0 and not dense.norm_unit_offset
    with pytest.raises(ValueError, match=r"KV heads of the global layers \(num_global_key_value_heads\) = 2"):
        check_divisible(dense, 4)
    shared = _config(save_gemma4_shared_kv(tmp_path / "shared"))
    # the last two layers read layer 3's (sliding) and layer 2's (full) K/V and keep none; without
    # attention_k_eq_v a global layer keeps num_key_value_heads
    assert shared.layer_specs == (
        SlidingWindow(4, 16, WINDOW),
        SlidingWindow(4, 16, WINDOW),
        FullAttention(4, 32),
        SlidingWindow(4, 16, WINDOW),
        SharedKV(3),
        SharedKV(2),
    )
    assert [shared.layer_window(i) for i in (4, 5)] == [WINDOW, None]
    # its sliding layers are half as wide as its global one: a block holds two of them, or the global one
    assert [g.layers for g in cache_layout(shared.layer_specs).groups] == [(0, 1), (3,), (2,)]
    assert shared.gemma4.mlp_sizes == (128,) * 4 + (256,) * 2 and shared.gemma4.hidden_size_per_layer_input == 8
    moe = _config(save_gemma4_moe(tmp_path / "moe"))
    # experts beside every layer's dense MLP, which none of them replaces
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size, moe.moe_layers) == (4, 2, 32, ())


def test_greedy_across_the_window_matches_transformers(gemma4_dir):
    assert greedy(gemma4_dir, PROMPTS) == hf_greedy(gemma4_dir, PROMPTS, GREEDY.max_tokens)


def test_chunks_and_a_cached_prefix_match_transformers(gemma4_dir):
    assert_cached_prefix_matches_transformers(gemma4_dir, max_num_batched_tokens=10, max_num_seqs=1)


def test_a_second_turn_read_from_the_prefix_cache_matches_transformers(gemma4_dir):
    assert_second_turn_matches_transformers(gemma4_dir)


def test_preempted_requests_resume_with_transformers_tokens(gemma4_dir):
    assert_preempted_requests_match_transformers(gemma4_dir, num_blocks=32)


def test_an_fp8_cache_over_layers_of_two_widths_gives_a_lone_engines_tokens(tmp_path):
    # the KV-shared model's sliding layers take half a unit each, their K/V views strided over blocks: on an
    # FP8 cache, prefix hits and preemption read back the quantized K/V a lone engine computes
    model_dir = save_gemma4_shared_kv(tmp_path)
    shared = random_prompts([40], seed=23)[0]
    prompts = [shared + p for p in random_prompts([2, 9, 20, 5, 13], seed=24)]
    crowded = engine(model_dir, device="cpu", kv_cache_dtype="fp8", num_kvcache_blocks=20, schedule_conservativeness=0)
    preempted = record_preemptions(crowded)
    outputs = crowded.generate(prompts, GREEDY, use_tqdm=False)
    assert preempted and any(o.num_cached_tokens for o in outputs)
    alone = [
        engine(model_dir, device="cpu", kv_cache_dtype="fp8").generate([p], GREEDY, use_tqdm=False)[0] for p in prompts
    ]
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in alone]
    # FP8 keys move this random model's later picks, but its first ones read the stored K/V as they should
    assert [o.outputs[0].token_ids[0] for o in outputs] == [t[0] for t in hf_greedy(model_dir, prompts, 1)]


@pytest.mark.slow
def test_two_ranks_equal_transformers(gemma4_dir):
    expected = hf_greedy(gemma4_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gemma4_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.slow
def test_the_triton_kernels_interpreted_match_transformers(gemma4_dir):
    prompts = PROMPTS[1::2]  # 20 and 75 tokens
    expected = hf_greedy(gemma4_dir, prompts, GREEDY.max_tokens)
    assert greedy(gemma4_dir, prompts, attention_backend="triton", max_num_batched_tokens=32) == expected


def test_a_multimodal_checkpoint_runs_as_its_language_model(multimodal_dir):
    assert greedy(multimodal_dir, PROMPTS) == hf_greedy(multimodal_dir, PROMPTS, GREEDY.max_tokens)


@pytest.mark.parametrize("modality", ["image", "audio"])
def test_an_image_or_audio_in_a_request_is_refused(multimodal_dir, modality):
    llm = LLM(multimodal_dir, **ENGINE)
    with pytest.raises(ValueError, match="multi_modal_data is not supported"):
        llm.generate({"prompt_token_ids": PROMPTS[0], "multi_modal_data": {modality: object()}}, GREEDY)
    llm.close()


@pytest.mark.gpu
def test_the_triton_kernels_give_transformers_tokens_on_the_gpu(gemma4_dir):
    """On CUDA: the Triton attention kernels over a cache of two head sizes (and KV-shared layers reading
    their source's), the experts in the fused MoE kernels; whole prompts, prompts cut every 16 tokens,
    decode steps in CUDA graphs."""
    expected = hf_greedy(gemma4_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gemma4_dir, PROMPTS, device="cuda") == expected
    assert greedy(gemma4_dir, PROMPTS, device="cuda", max_num_batched_tokens=16) == expected


@pytest.mark.gpu
def test_global_layers_of_head_dim_512_give_transformers_tokens_on_the_gpu(tmp_path):
    """Gemma 4's real head sizes: sliding layers of 256, global ones of 512, in the Triton kernels' tiles
    for them, eagerly and in CUDA graphs."""
    model_dir = save_gemma4_dense(tmp_path, head_dim=256, global_head_dim=512)
    expected = hf_greedy(model_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(model_dir, PROMPTS, device="cuda") == expected
    assert greedy(model_dir, PROMPTS, device="cuda", max_num_batched_tokens=16, enforce_eager=True) == expected
