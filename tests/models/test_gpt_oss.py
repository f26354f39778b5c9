"""gpt-oss against transformers' own GptOssForCausalLM on a tiny random model: sliding and full layers in turn
with prompts that run past the window, attention sinks, biased router and experts with the clamped SwiGLU,
YaRN rotary; greedy tokens in 16-token prefill chunks, with prefix-cache hits, preemption and at two ranks
(CPU); on a GPU through the Triton kernels. A checkpoint with MXFP4 experts, as the published ones, gives
transformers' tokens (its experts dequantized) with its experts held as bytes."""

import json
from pathlib import Path

import pytest
import torch

from nanovllm.config import Config
from nanovllm.layers.attention import Attention
from nanovllm.llm import LLM
from nanovllm.models import model_class
from nanovllm.utils.loader import load_dummy_weights, load_model
from nanovllm.utils.parallel import tensor_parallel

from helpers.family_checks import (
    GREEDY,
    assert_cached_prefix_matches_transformers,
    assert_matches_transformers,
    assert_preempted_requests_match_transformers,
    greedy,
    prompts_with_a_shared_prefix,
)
from helpers.hf_reference import hf_greedy
from helpers.moe_models import PROMPTS, save_gpt_oss, save_gpt_oss_mxfp4, tensor_names


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    return save_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss"))


@pytest.fixture(scope="module")
def mxfp4_dir(tmp_path_factory):
    # experts 64 wide: at two ranks, 32 each, one MXFP4 block
    full = save_gpt_oss(tmp_path_factory.mktemp("tiny-gpt-oss-64"), intermediate_size=64)
    return save_gpt_oss_mxfp4(full, tmp_path_factory.mktemp("tiny-gpt-oss-mxfp4"))


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


def experts_of(model_dir: str, rank: int = 0, size: int = 1, dummy: bool = False):
    """Layer 1's experts of rank `rank` of `size`, loaded from `model_dir`'s checkpoint or `dummy`."""
    model_config = Config(model_dir).model_config
    with tensor_parallel(rank, size):
        model = model_class(model_config)(model_config)
    if dummy:
        load_dummy_weights(model, model_config, seed=3)
    else:
        load_model(model, model_dir)
    return model.model.layers[1].mlp.experts


def test_mxfp4_experts_are_held_as_bytes(mxfp4_dir):
    assert {"model.layers.1.mlp.experts.gate_up_proj_blocks", "model.layers.1.mlp.experts.down_proj_scales"} <= set(
        tensor_names(mxfp4_dir)
    )
    experts = experts_of(mxfp4_dir)
    # hidden 64, experts 64 wide: values two a byte, a scale per 32
    shapes = {name: (p.dtype, tuple(p.shape)) for name, p in experts.named_parameters()}
    assert shapes == {
        "w13": (torch.uint8, (8, 128, 32)),
        "w13_scale": (torch.uint8, (8, 128, 2)),
        "w2": (torch.uint8, (8, 64, 32)),
        "w2_scale": (torch.uint8, (8, 64, 2)),
        "w13_bias": (torch.float32, (8, 128)),
        "w2_bias": (torch.float32, (8, 64)),
    }


def test_mxfp4_greedy_matches_transformers_with_the_experts_dequantized(mxfp4_dir):
    assert greedy(mxfp4_dir, PROMPTS) == hf_greedy(mxfp4_dir, PROMPTS, GREEDY.max_tokens)


@pytest.mark.slow
def test_mxfp4_at_two_ranks_matches_transformers(mxfp4_dir):
    expected = hf_greedy(mxfp4_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(mxfp4_dir, PROMPTS, tensor_parallel_size=2, device="cpu") == expected


@pytest.mark.parametrize("dummy", [False, True], ids=["checkpoint", "dummy"])
def test_each_rank_holds_whole_mxfp4_blocks_of_every_expert(mxfp4_dir, dummy):
    whole = experts_of(mxfp4_dir, dummy=dummy)
    for rank in (0, 1):
        part = experts_of(mxfp4_dir, rank, 2, dummy)
        for name in ("w13", "w13_scale"):  # this rank's gate rows, then its up rows
            gate, up = getattr(whole, name).chunk(2, dim=1)
            assert torch.equal(getattr(part, name), torch.cat([gate.chunk(2, 1)[rank], up.chunk(2, 1)[rank]], 1))
        for name in ("w2", "w2_scale"):  # this rank's inputs of down
            assert torch.equal(getattr(part, name), getattr(whole, name).chunk(2, dim=2)[rank])
    if dummy:  # scales that keep the weights as small as other dummy weights
        assert whole.w13_scale.min() >= 116 and whole.w13_scale.max() <= 117 and whole.w13.max() > 200


def with_quantization(model_dir: str, path: Path, quantization: dict) -> str:
    """A copy of `model_dir`'s config.json (in `path`) with `quantization` as its quantization_config."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": quantization}))
    return str(path)


def test_mxfp4_checkpoints_that_leave_the_experts_unquantized_are_refused(mxfp4_dir, tmp_path):
    quantization = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.mlp.experts", "lm_head"]}
    with pytest.raises(ValueError, match=r"leaves its experts unquantized \(modules_to_not_convert: model"):
        Config(with_quantization(mxfp4_dir, tmp_path, quantization))


def test_full_precision_experts_under_an_mxfp4_config_are_refused(gpt_oss_dir, tmp_path):
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((Path(gpt_oss_dir) / name).read_bytes())
    model_dir = with_quantization(gpt_oss_dir, tmp_path, {"quant_method": "mxfp4"})
    with pytest.raises(ValueError, match=r"the experts' (gate_up|down)_proj is torch.float32, not MXFP4"):
        experts_of(model_dir)


@pytest.mark.gpu
def test_the_triton_kernels_give_transformers_tokens_on_the_gpu(gpt_oss_dir):
    """On CUDA the sinks run in the attention kernels, the biased experts and the clamped SwiGLU in the fused
    MoE kernels: whole prompts, prompts cut every 16 tokens, decode steps in CUDA graphs."""
    expected = hf_greedy(gpt_oss_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(gpt_oss_dir, PROMPTS, device="cuda") == expected
    assert greedy(gpt_oss_dir, PROMPTS, device="cuda", max_num_batched_tokens=16) == expected


@pytest.mark.gpu
def test_mxfp4_experts_in_the_triton_kernels_give_transformers_tokens_on_the_gpu(mxfp4_dir):
    """The MXFP4 experts dequantized inside the fused MoE kernels: grouped GEMMs for whole prompts, the
    few-token kernels in decode steps, eagerly and in CUDA graphs."""
    expected = hf_greedy(mxfp4_dir, PROMPTS, GREEDY.max_tokens)
    assert greedy(mxfp4_dir, PROMPTS, device="cuda") == expected
    assert greedy(mxfp4_dir, PROMPTS, device="cuda", max_num_batched_tokens=16, enforce_eager=True) == expected
