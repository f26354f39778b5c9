"""Config: defaults, validation and the errors a user sees."""

import json
import os

import pytest

from nanovllm import LLM
from nanovllm.config import Config


def test_defaults_follow_the_design(qwen3_dir):
    config = Config(qwen3_dir)
    assert (config.max_num_batched_tokens, config.max_num_seqs, config.gpu_memory_utilization,
            config.tensor_parallel_size, config.kvcache_block_size, config.num_kvcache_blocks) == (
        16384, 512, 0.9, 1, 256, -1)
    assert config.device == "cpu"
    # max_model_len is capped by the model's max_position_embeddings (1024 here)
    assert config.max_model_len == 1024


def test_unknown_keyword_is_named(qwen3_dir):
    with pytest.raises(ValueError, match="unknown argument.*max_num_sequences"):
        LLM(qwen3_dir, max_num_sequences=4)


@pytest.mark.parametrize("kwargs, message", [
    ({"kvcache_block_size": 24}, "power of two >= 16"),
    ({"kvcache_block_size": 8}, "power of two >= 16"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"num_kvcache_blocks": 0}, "num_kvcache_blocks"),
    ({"dtype": "float8"}, "dtype"),
    ({"load_format": "pt"}, "load_format"),
    ({"device": "tpu"}, "device"),
    ({"max_num_batched_tokens": 100, "max_model_len": 200, "enable_chunked_prefill": False},
     "max_num_batched_tokens .* must be at least max_model_len"),
    ({"attention_backend": "xformers"}, "attention_backend must be one of"),
    ({"attention_backend": "flash_attn"}, "flash_attn"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"master_port": 70000}, "master_port"),
])
def test_bad_values_are_refused(qwen3_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config.from_kwargs(qwen3_dir, **kwargs)


def test_chunked_prefill_is_on_by_default_and_lets_prompts_exceed_the_token_budget(qwen3_dir):
    config = Config(qwen3_dir, max_num_batched_tokens=100, max_model_len=800)
    assert config.enable_chunked_prefill and (config.max_num_batched_tokens, config.max_model_len) == (100, 800)


def test_small_power_of_two_blocks_are_accepted(qwen3_dir):
    assert Config(qwen3_dir, kvcache_block_size=16).kvcache_block_size == 16


def test_missing_model_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"))


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(tmp_path))


def test_dtype_defaults_to_the_checkpoint(qwen3_dir, tmp_path):
    import torch
    assert Config(qwen3_dir).torch_dtype == torch.float32
    assert Config(qwen3_dir, dtype="bfloat16").torch_dtype == torch.bfloat16
    with open(os.path.join(qwen3_dir, "config.json")) as f:
        raw = json.load(f)
    raw["dtype"] = "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert Config(str(tmp_path)).torch_dtype == torch.bfloat16


def test_auto_attention_backend_is_torch_on_cpu(qwen3_dir):
    assert Config(qwen3_dir, device="cpu").attention_backend == "torch"


def test_triton_on_cpu_needs_the_interpreter(qwen3_dir, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        Config(qwen3_dir, device="cpu", attention_backend="triton")


@pytest.mark.parametrize("size, message", [
    (3, r"attention heads \(num_attention_heads\) = 4"),
    (4, r"KV heads \(num_key_value_heads\) = 2"),
])
def test_heads_that_do_not_split_are_refused(qwen3_dir, size, message):
    with pytest.raises(ValueError, match=f"tensor_parallel_size={size} must divide the model's {message}"):
        Config(qwen3_dir, tensor_parallel_size=size)


def test_vocabulary_that_does_not_split_is_refused(qwen3_dir, tmp_path):
    with open(os.path.join(qwen3_dir, "config.json")) as f:
        raw = json.load(f)
    raw["vocab_size"] = 513
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"vocabulary \(vocab_size\) = 513"):
        Config(str(tmp_path), tensor_parallel_size=2)


def test_fewer_gpus_than_ranks_is_refused(qwen3_dir, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs one GPU per rank but 1 is visible"):
        Config(qwen3_dir, device="cuda", tensor_parallel_size=2)
    assert Config(qwen3_dir, device="cuda", tensor_parallel_size=1).tensor_parallel_size == 1
