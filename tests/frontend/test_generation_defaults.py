"""The generation config's sampling values as request defaults: read, checked, and applied by LLM."""

import json
import logging
import shutil

import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.config import Config
from nanovllm.frontend.generation_defaults import generation_defaults

QWEN3_RECOMMENDS = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": 1}


def model_with_generation_config(source: str, folder, values: dict) -> str:
    shutil.copytree(source, folder)
    (folder / "generation_config.json").write_text(json.dumps(values))
    return str(folder)


def test_the_sampling_values_of_the_models_file_are_the_defaults(qwen3_dir, tmp_path):
    model = model_with_generation_config(qwen3_dir, tmp_path / "m", {**QWEN3_RECOMMENDS, "repetition_penalty": 1.1})
    assert generation_defaults(Config(model)) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "repetition_penalty": 1.1,
    }
    assert generation_defaults(Config(model, generation_config="vllm")) == {}
    assert generation_defaults(Config(qwen3_dir, generation_config=model))["top_k"] == 20
    assert generation_defaults(Config(qwen3_dir)) == {}  # its file recommends no sampling values


def test_a_bad_generation_config_is_an_error_that_names_the_file(qwen3_dir, tmp_path):
    model = model_with_generation_config(qwen3_dir, tmp_path / "m", {"top_p": 2.0})
    with pytest.raises(ValueError, match=r"generation_config.json recommends invalid sampling values: top_p"):
        generation_defaults(Config(model))
    (tmp_path / "m" / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"generation_config.json is not valid JSON"):
        generation_defaults(Config(model))
    with pytest.raises(FileNotFoundError, match="neither 'auto', 'vllm' nor a folder"):
        Config(qwen3_dir, generation_config=str(tmp_path / "missing"))


def test_llm_samples_with_the_defaults_when_given_no_settings(qwen3_dir, tmp_path, caplog):
    # top_k 1 keeps only the most likely token: the draws at temperature 1 equal greedy decoding
    model = model_with_generation_config(qwen3_dir, tmp_path / "m", {"temperature": 1.0, "top_k": 1})
    engine_args = dict(block_size=16, num_kvcache_blocks=64, max_model_len=256)
    prompts = [[5, 6, 7], [8, 9]]
    with caplog.at_level(logging.INFO, logger="nanovllm.frontend.engine_frontend"):
        llm = LLM(model, **engine_args)
    assert "sampling defaults from" in caplog.text and "top_k=1" in caplog.text
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (1.0, 1, 1.0)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    for _ in range(3):
        got = [o.outputs[0].token_ids[:16] for o in llm.generate(prompts, use_tqdm=False)]
        assert got == [ids[: len(g)] for ids, g in zip(expected, got)]
    llm.close()
    plain = LLM(model, generation_config="vllm", **engine_args)
    assert plain.get_default_sampling_params().top_k == SamplingParams().top_k
    plain.close()
