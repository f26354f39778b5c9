"""speculative_config: vLLM's keys read into a SpeculativeConfig, and the errors a user sees."""

import json

import pytest

from nanovllm.cli import build_parser
from nanovllm.config import Config
from nanovllm.spec_decode.speculative_config import SpeculativeConfig


def test_ngram_settings_are_read_with_vllms_names():
    settings = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
    assert SpeculativeConfig.from_dict(settings) == SpeculativeConfig("ngram", 4, 2, 3)


def test_draft_model_settings_are_read_with_vllms_names():
    settings = {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 4}
    assert SpeculativeConfig.from_dict(settings) == SpeculativeConfig("draft_model", 4, model="/models/small")


@pytest.mark.parametrize(
    "bounds, expected",
    [({}, (5, 5)), ({"prompt_lookup_max": 3}, (3, 3)), ({"prompt_lookup_min": 2}, (2, 2))],
)
def test_a_missing_lookup_bound_takes_the_other_or_five(bounds, expected):
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, **bounds})
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == expected


def test_requests_stop_drafting_above_a_batch_size_that_keeps_verify_steps_memory_bound_by_default():
    settings = {"method": "ngram", "num_speculative_tokens": 3}
    assert SpeculativeConfig.from_dict(settings).drafting_batch_limit == 64
    assert SpeculativeConfig.from_dict({**settings, "disable_by_batch_size": 8}).drafting_batch_limit == 8


@pytest.mark.parametrize(
    "settings, message",
    [
        ([("method", "ngram")], "must be a dict"),
        ({"method": "ngram", "num_speculative_tokens": 2, "n": 1}, r"unknown key\(s\) 'n'; valid ones are: method"),
        ({"num_speculative_tokens": 2}, "'method' must be one of ngram, draft_model, mtp, got None"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "got 'eagle'"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model', the local folder"),
        ({"method": "draft_model", "model": 3, "num_speculative_tokens": 2}, "needs 'model'.*got 3"),
        ({"method": "draft_model", "model": "/d"}, "needs 'num_speculative_tokens'"),
        (
            {"method": "draft_model", "model": "/d", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "does not take",
        ),
        ({"method": "ngram", "model": "/d", "num_speculative_tokens": 2}, "does not take"),
        ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "must be an integer >= 1, got 0"),
        ({"method": "ngram", "num_speculative_tokens": True}, "must be an integer >= 1, got True"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": "2"}, "'prompt_lookup_min' must be"),
        ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "'disable_by_batch_size' must"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "exceed"),
    ],
)
def test_bad_settings_say_what_to_change(settings, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.from_dict(settings)


def test_config_reads_speculative_config_and_refuses_a_bad_one(qwen3_dir):
    assert Config(qwen3_dir).speculative is None
    config = Config(qwen3_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert config.speculative == SpeculativeConfig("ngram", 3, 5, 5)
    with pytest.raises(ValueError, match="speculative_config must be a dict, got 'ngram'"):
        Config.from_kwargs(qwen3_dir, speculative_config="ngram")
    with pytest.raises(ValueError, match="needs 'model'"):
        Config.from_kwargs(qwen3_dir, speculative_config={"method": "draft_model", "num_speculative_tokens": 3})


def test_serve_takes_the_config_as_json():
    settings = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    args = build_parser().parse_args(["serve", "/m", "--speculative-config", json.dumps(settings)])
    assert args.speculative_config == settings
    assert build_parser().parse_args(["serve", "/m"]).speculative_config is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--speculative-config", "[3]"])
