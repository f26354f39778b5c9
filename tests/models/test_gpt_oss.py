"""gpt-oss against transformers' own GptOssForCausalLM on a tiny random model: sliding and full layers in turn
with prompts that run past the window, attention sinks, biased router and experts with the clamped SwiGLU,
YaRN rotary; greedy tokens in 16-token prefill chunks, with prefix-cache hits, preemption and at two ranks
(CPU); on a GPU through the Triton kernels. MXFP4 checkpoints are refused by name."""

import json
from pathlib import Path

import pytest

from nanovllm.config import Config
from nanovllm.layers.attention import Attention
from nanovllm.llm import LLM

from helpers.family_checks import (
    GREEDY,
    assert_cached_prefix_matches_transformers,
    assert_matches_transformers,
    assert_preempted_requests_match_transformers,
    greedy,
    prompts_with_a_shared_prefix,
)
from helpers.hf_reference import hf_greedy
from helpers.moe_models import PROMPTS, save_gpt_oss, tensor_names


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return save_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))


def test_the_checkpoint_stacks_biased_experts_and_holds_sinks(gpt_oss_dir):
    names = set(tensor_names(gpt_oss_dir))
    experts = {f"model.layers.1.mlp.experts.{p}" for p in ("gate_up_proj", "gate_up_proj_bias", "down_proj")}
    assert experts | {"model.layers.1.mlp.router.bias", "model.layers.1.self_attn.sinks"} <= names
    config = Config(gpt_oss_dir).model_config
    assert config.attention_sinks and config.expert_bias and config.expert_act == "gpt_oss_swiglu"
    assert [config.layer_window(i) for i in range(4)] == [20, None, 20, None]
    assert config.moe_layers == (0, 1, 2, 3) and config.norm_topk_prob


def test_greedy_matches_transformers_past_the_window(gpt_oss_dir):
    assert greedy(gpt_oss_dir, PROMPTS) == hf_greedy(gpt_oss_dir, PROMPTS, GREEDY.max_tokens)


def test_the_sinks_change_the_tokens(gpt_oss_dir, monkeypatch):
    """The check above would fail were the sinks left out of the softmax."""
    forward = Attention.forward

    def without_sinks(self, *args, **kwargs):
        self.scoring = {**self.scoring, "sinks": None}
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(Attention, "forward", without_sinks)
    assert greedy(gpt_oss_dir, PROMPTS) != hf_greedy(gpt_oss_dir, PROMPTS, GREEDY.max_tokens)


@pytest.mark.slow
def test_chunks_cached_prefixes_and_two_ranks_match_transformers(gpt_oss_dir):
    assert_matches_transformers(gpt_oss_dir, prompts_with_a_shared_prefix())


@pytest.mark.slow
def test_prefix_hits_and_preemption_match_transformers(gpt_oss_dir):
    # a second turn read from the prefix cache: tests/models/test_second_turn.py
    assert_cached_prefix_matches_transformers(gpt_oss_dir)
    assert_preempted_requests_match_transformers(gpt_oss_dir, num_blocks=12)


def test_dummy_weights_fill_the_experts_stacked_inputs_first(gpt_oss_dir):
    """Benchmarks' dummy weights are drawn in the checkpoint's shapes, which gpt-oss stacks inputs first."""
    llm = LLM(gpt_oss_dir, load_format="dummy", block_size=16, num_kvcache_blocks=16)
    experts = llm.client.core.executor.model.model.layers[0].mlp.experts
    assert 0 < experts.w13.abs().min() and experts.w13.abs().max() <= 1e-3
    [out] = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


def test_mxfp4_checkpoints_are_refused_by_name(gpt_oss_dir, tmp_path):
    config = json.loads((Path(gpt_oss_dir) / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method 'mxfp4' are not supported"):
        Config(str(tmp_path))


@pytest.mark.gpu
def test_the_triton_kernels_give_transformers_tokens_on_the_gpu(gpt_oss_dir):
    """On CUDA the sinks run in the attention kernels, the biased experts and the clamped SwiGLU in the fused
    MoE kernels: whole prompts, prompts cut every 16 tokens, decode steps in CUDA graphs."""
    expected = hf_greedy(gpt_oss_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gpt_oss_dir, PROMPTS, device="cuda") == expected
    assert greedy(gpt_oss_dir, PROMPTS, device="cuda", max_num_batched_tokens=16) == expected
