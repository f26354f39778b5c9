"""Config: defaults, validation and the errors a user sees."""

import json
import os
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from nanovllm import LLM, SamplingParams
from nanovllm.cli import build_parser
from nanovllm.config import Config
from nanovllm.worker import kv_cache_sizing

GIB = 1 << 30


def test_defaults_follow_the_design(qwen3_dir):
    config = Config(qwen3_dir)
    assert (
        config.token_budget,
        config.max_num_seqs,
        config.gpu_memory_utilization,
        config.tensor_parallel_size,
        config.kv_block_size,
        config.num_kvcache_blocks,
    ) == (256, 512, 0.9, 1, 16, -1)
    assert config.block_size is None  # the device's default, resolved into kv_block_size
    assert (config.device_type, config.attention_impl) == ("cpu", "torch")
    # max_model_len defaults to the model's max_position_embeddings (1024 here), at most 4096
    assert config.context_len == 1024


def test_the_fields_stay_as_given_and_what_is_derived_is_its_own_value(qwen3_dir):
    config = Config(qwen3_dir)
    assert (config.max_model_len, config.max_num_batched_tokens, config.attention_backend, config.device) == (
        -1,
        -1,
        "auto",
        "auto",
    )
    assert (config.context_len, config.token_budget, config.attention_impl, config.device_type) == (
        1024,
        256,
        "torch",
        "cpu",
    )


@pytest.mark.parametrize(
    "kwargs, budget",
    [
        ({}, 256),  # the CPU's chunk: a step of it keeps decoding streams' gaps near a second
        ({"device": "cuda"}, 16384),
        ({"enable_chunked_prefill": False}, 1024),  # a whole prompt of max_model_len must fit one step
        ({"enable_chunked_prefill": False, "max_model_len": 128}, 256),
        ({"max_num_batched_tokens": 100}, 100),
    ],
)
def test_token_budget_follows_the_device(qwen3_dir, monkeypatch, kwargs, budget):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    kwargs.setdefault("device", "cpu")
    assert Config(qwen3_dir, **kwargs).token_budget == budget


def test_unknown_keyword_is_named(qwen3_dir):
    with pytest.raises(ValueError, match="unknown argument.*max_num_sequences"):
        LLM(qwen3_dir, max_num_sequences=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"block_size": 24},
            r"block_size must be a power of two >= 16 \(or None / -1 for the device's default\), got 24",
        ),
        ({"block_size": 8}, "power of two >= 16"),
        ({"block_size": -2}, "power of two >= 16"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"num_kvcache_blocks": 0}, "num_kvcache_blocks"),
        ({"dtype": "float8"}, "dtype"),
        ({"load_format": "pt"}, "load_format"),
        ({"device": "tpu"}, "device"),
        (
            {"max_num_batched_tokens": 100, "max_model_len": 200, "enable_chunked_prefill": False},
            "max_num_batched_tokens .* must be at least max_model_len",
        ),
        ({"attention_backend": "xformers"}, "attention_backend must be one of"),
        ({"attention_backend": "flash_attn"}, "flash_attn"),
        ({"kv_cache_dtype": "int8"}, r"kv_cache_dtype must be one of auto, fp8, got 'int8'"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"master_port": 70000}, "master_port"),
        ({"master_port": -1}, r"master_port must be in \[0, 65535\]"),
        ({"max_num_batched_tokens": 0}, r"max_num_batched_tokens must be >= 1, or -1 for the device's default, got 0"),
        ({"max_num_batched_tokens": -2}, r"max_num_batched_tokens must be >= 1, or -1 .*got -2"),
        ({"max_model_len": 0}, r"max_model_len must be >= 1, or -1 for the model's limit \(at most 4096\), got 0"),
        ({"max_model_len": -2}, r"max_model_len must be >= 1, or -1 .*got -2"),
        ({"gpu_memory_utilization": 0}, r"gpu_memory_utilization must be in \(0, 1\], got 0"),
        ({"num_kvcache_blocks": -2}, r"num_kvcache_blocks must be -1 \(size from memory\) or >= 1, got -2"),
        ({"cpu_kvcache_gb": 0}, "cpu_kvcache_gb must be a finite number > 0, got 0"),
        ({"cpu_kvcache_gb": float("inf")}, "cpu_kvcache_gb must be a finite number > 0, got inf"),
        ({"cpu_kvcache_gb": float("nan")}, "cpu_kvcache_gb must be a finite number > 0, got nan"),
        ({"schedule_conservativeness": -0.5}, "schedule_conservativeness must be a finite number >= 0, got -0.5"),
        (
            {"schedule_conservativeness": float("inf")},
            "schedule_conservativeness must be a finite number >= 0, got inf",
        ),
        ({"seed": 1 << 63}, r"seed must be in \[-2\*\*63, 2\*\*63 - 1\]"),
        ({"seed": -(1 << 63) - 1}, r"seed must be in \[-2\*\*63, 2\*\*63 - 1\]"),
    ],
)
def test_bad_values_are_refused(qwen3_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config.from_kwargs(qwen3_dir, **kwargs)


def test_any_64_bit_seed_is_accepted(qwen3_dir):
    assert [Config(qwen3_dir, seed=s).seed for s in (-(1 << 63), -1, (1 << 63) - 1)] == [-(1 << 63), -1, (1 << 63) - 1]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_model_len": "2048"}, r"^max_model_len must be an integer, got '2048' \(str\)$"),
        ({"max_num_seqs": True}, r"^max_num_seqs must be an integer, got True \(bool\)$"),
        ({"tensor_parallel_size": 2.0}, r"^tensor_parallel_size must be an integer, got 2.0 \(float\)$"),
        ({"seed": None}, r"^seed must be an integer, got None \(NoneType\)$"),
        ({"gpu_memory_utilization": "0.9"}, r"^gpu_memory_utilization must be a number, got '0.9' \(str\)$"),
        ({"cpu_kvcache_gb": False}, r"^cpu_kvcache_gb must be a number, got False \(bool\)$"),
        ({"enforce_eager": "yes"}, r"^enforce_eager must be True or False, got 'yes' \(str\)$"),
        ({"enable_chunked_prefill": 1}, r"^enable_chunked_prefill must be True or False, got 1 \(int\)$"),
        ({"device": 3}, r"^device must be a string, got 3 \(int\)$"),
    ],
)
def test_wrongly_typed_values_are_refused(qwen3_dir, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config.from_kwargs(qwen3_dir, **kwargs)


@pytest.mark.parametrize("name", [f.name for f in fields(Config) if f.init and f.name != "model"])
def test_every_field_refuses_a_value_of_the_wrong_type(qwen3_dir, name):
    with pytest.raises(
        ValueError,
        match=rf"^{name} must be (an integer|a number|True or False|a string|a dict), "
        rf"got \[\] \(list\)$",
    ):
        Config.from_kwargs(qwen3_dir, **{name: []})


def test_types_are_checked_before_anything_else(tmp_path):
    with pytest.raises(ValueError, match="max_num_seqs must be an integer, got '0'"):
        Config.from_kwargs(str(tmp_path / "nowhere"), max_num_seqs="0", block_size=3)
    with pytest.raises(ValueError, match=r"^model must be a string, got 3 \(int\)$"):
        Config.from_kwargs(3)


def test_ints_are_numbers_and_paths_are_model_folders(qwen3_dir):
    config = Config.from_kwargs(Path(qwen3_dir), gpu_memory_utilization=1, cpu_kvcache_gb=3)
    assert (config.model, config.gpu_memory_utilization, config.cpu_kvcache_gb) == (qwen3_dir, 1, 3)


@pytest.mark.parametrize("max_model_len", [1025, 4096, 100000])
def test_max_model_len_above_the_model_limit_is_refused(qwen3_dir, max_model_len):
    with pytest.raises(
        ValueError,
        match=rf"max_model_len={max_model_len} exceeds the model's limit of 1024 tokens "
        rf"\(max_position_embeddings in config.json\); max_model_len must not "
        rf"exceed 1024: lower it, or leave it out \(-1\) for 1024",
    ):
        Config.from_kwargs(qwen3_dir, max_model_len=max_model_len)


def test_max_model_len_up_to_the_model_limit_is_kept(qwen3_dir):
    assert [Config.from_kwargs(qwen3_dir, max_model_len=n).context_len for n in (1, 1024, -1)] == [1, 1024, 1024]


def test_max_model_len_left_out_is_at_most_4096(qwen3_dir, tmp_path):
    with open(os.path.join(qwen3_dir, "config.json")) as f:
        raw = json.load(f)
    raw["max_position_embeddings"] = 32768
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert Config.from_kwargs(str(tmp_path)).context_len == 4096
    assert Config.from_kwargs(str(tmp_path), max_model_len=32768).context_len == 32768


def test_serve_defaults_make_a_valid_config(qwen3_dir):
    # `nanovllm serve` passes every field, its default included
    args = vars(build_parser().parse_args(["serve", qwen3_dir]))
    engine_args = {f.name: args[f.name] for f in fields(Config) if f.init and f.name != "model"}
    assert Config.from_kwargs(qwen3_dir, **engine_args).context_len == 1024


def test_chunked_prefill_is_on_by_default_and_lets_prompts_exceed_the_token_budget(qwen3_dir):
    config = Config(qwen3_dir, max_num_batched_tokens=100, max_model_len=800)
    assert config.enable_chunked_prefill and (config.token_budget, config.context_len) == (100, 800)


def test_small_power_of_two_blocks_are_accepted(qwen3_dir):
    config = Config(qwen3_dir, block_size=16)
    assert (config.block_size, config.kv_block_size) == (16, 16)


@pytest.mark.parametrize("block_size", [None, -1])
def test_the_block_size_default_is_16_tokens_on_cuda_and_on_the_cpu(qwen3_dir, monkeypatch, block_size):
    config = Config(qwen3_dir, device="cpu", block_size=block_size)
    assert (config.block_size, config.kv_block_size) == (block_size, 16)  # the option stays as given
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert Config(qwen3_dir, device="cuda", block_size=block_size).kv_block_size == 16


def test_the_block_size_flag_takes_vllms_name(qwen3_dir):
    args = build_parser().parse_args(["serve", qwen3_dir, "--block-size", "32"])
    assert args.block_size == 32
    assert build_parser().parse_args(["serve", qwen3_dir]).block_size is None


@pytest.mark.parametrize(
    "dtype, want",
    [("half", torch.float16), ("float16", torch.float16), ("float", torch.float32), ("bfloat16", torch.bfloat16)],
)
def test_dtype_takes_vllms_names(qwen3_dir, dtype, want):
    assert Config(qwen3_dir, dtype=dtype).torch_dtype == want
    assert build_parser().parse_args(["serve", qwen3_dir, "--dtype", dtype]).dtype == dtype


def test_a_half_precision_engine_generates(qwen3_dir):
    llm = LLM(qwen3_dir, dtype="half", block_size=16, num_kvcache_blocks=16, max_model_len=128)
    [output] = llm.generate([[2, 3, 4]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 3 and llm.client.info.kv_cache_dtype == "float16"


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
    assert Config(qwen3_dir, device="cpu").attention_impl == "torch"


def test_triton_on_cpu_needs_the_interpreter(qwen3_dir, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        Config(qwen3_dir, device="cpu", attention_backend="triton")


def test_heads_that_do_not_split_are_refused(qwen3_dir):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 must divide the model's attention heads") as e:
        Config(qwen3_dir, tensor_parallel_size=3)
    assert "KV heads (num_key_value_heads, or be a multiple of them) = 2" in str(e.value)


def test_more_ranks_than_kv_heads_repeat_them(qwen3_dir):
    # 4 ranks over 2 KV heads: one each, repeated (the greedy tokens: tests/worker/test_tensor_parallel_four_ranks.py)
    assert Config(qwen3_dir, tensor_parallel_size=4, device="cpu").tensor_parallel_size == 4


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


def test_fp8_weights_on_a_gpu_without_fp8_tensor_cores_are_refused(qwen3_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))  # an A100
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer.*this one is 8.0"):
        Config(qwen3_dir, device="cuda", quantization="fp8")
    assert Config(qwen3_dir, device="cuda").fp8_weights is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    assert Config(qwen3_dir, device="cuda", quantization="fp8").fp8_weights is not None


def test_cpu_kv_cache_larger_than_the_available_memory_is_refused(qwen3_dir, monkeypatch):
    # 8192 sequences of 4 blocks could use 4 GiB, so all 3 GiB asked for would be allocated
    monkeypatch.setattr(kv_cache_sizing, "available_memory_bytes", lambda: 2 * GIB)
    with pytest.raises(
        ValueError,
        match=r"a 3 GiB KV cache \(cpu_kvcache_gb=3\) does not fit in memory: "
        r"2 GiB is available and the cache may take at most 90% of it \(1.8 GiB\), "
        r"leaving the rest for activations; lower cpu_kvcache_gb "
        r"\(or set num_kvcache_blocks\)",
    ):
        LLM(qwen3_dir, cpu_kvcache_gb=3, max_num_seqs=8192)


def test_cpu_kv_cache_is_checked_at_the_size_sequences_can_use(qwen3_dir, monkeypatch):
    # 4 sequences of 256 tokens use 64 blocks of 16 tokens, far less than the 100 GiB asked for
    monkeypatch.setattr(kv_cache_sizing, "available_memory_bytes", lambda: GIB)
    llm = LLM(qwen3_dir, cpu_kvcache_gb=100, max_num_seqs=4, max_model_len=256, block_size=16)
    assert llm.client.core.executor.num_kvcache_blocks == 64


def test_available_memory_is_read_with_or_without_proc(monkeypatch):
    assert kv_cache_sizing.available_memory_bytes() > 0
    monkeypatch.setattr(kv_cache_sizing.os.path, "exists", lambda path: False)
    assert kv_cache_sizing.available_memory_bytes() > 0


def test_prefix_caching_can_be_turned_off(qwen3_dir):
    prompt = list(range(2, 40))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = {}
    for enabled in (True, False):
        llm = LLM(qwen3_dir, enable_prefix_caching=enabled, block_size=16, num_kvcache_blocks=16, max_model_len=128)
        first, again = (llm.generate([prompt], params, use_tqdm=False)[0] for _ in range(2))
        outputs[enabled] = again.outputs[0].token_ids
        assert again.num_cached_tokens == (32 if enabled else 0)
        assert llm.client.core.stats().prefix_cache_queries == (2 * len(prompt) if enabled else 0)
    assert outputs[True] == outputs[False]


def test_trust_remote_code_is_accepted_with_a_warning_that_it_changes_nothing(qwen3_dir):
    with pytest.warns(UserWarning, match="trust_remote_code=True changes nothing"):
        assert Config(qwen3_dir, trust_remote_code=True).trust_remote_code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config(qwen3_dir, trust_remote_code=False)


def test_device_auto_is_the_gpu_when_one_is_visible(qwen3_dir, monkeypatch):
    assert Config(qwen3_dir).device_type == "cpu"
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    assert Config(qwen3_dir, device="auto").device_type == "cuda"
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs one GPU per rank but 1 is visible"):
        Config(qwen3_dir, device="auto", tensor_parallel_size=2)
