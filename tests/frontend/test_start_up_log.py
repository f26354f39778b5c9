"""The start-up log of LLM(): what runs, where, and the figures the model runner measured while starting."""

import logging

import pytest

from nanovllm import LLM
from nanovllm.frontend.start_up_log import memory_size


def start_up_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("nanovllm.")]


def test_memory_sizes_read_in_mib_below_a_gib():
    assert (memory_size(3 << 19), memory_size(1023 << 20), memory_size(5 << 30)) == (
        "1.5 MiB",
        "1023.0 MiB",
        "5.00 GiB",
    )


def test_llm_logs_its_start_up_with_the_measured_figures(qwen3_dir, caplog):
    caplog.set_level(logging.INFO, logger="nanovllm")
    llm = LLM(qwen3_dir, block_size=16, num_kvcache_blocks=32, max_model_len=256)
    runner = llm.client.core.executor
    weights = sum(t.numel() * t.element_size() for t in [*runner.model.parameters(), *runner.model.buffers()])
    kv_cache = runner.kv_cache.values
    report = llm.client.info.start_up
    assert report.weights_bytes == weights and report.kv_cache_bytes == kv_cache.numel() * kv_cache.element_size()
    assert report.load_seconds > 0 and report.graph_capture_seconds is None  # no CUDA graphs on the CPU
    lines = start_up_lines(caplog)
    assert lines[:5] == [
        f"model: {qwen3_dir}",
        f"architecture Qwen3ForCausalLM, dtype float32, device {report.device_name}",
        f"weights: {memory_size(weights)}, loaded in {report.load_seconds:.2f} s",
        f"KV cache: 512 tokens in 32 blocks of 16 tokens (float32, {memory_size(report.kv_cache_bytes)})",
        # 32 blocks of 16 tokens hold two sequences of 256 tokens in the one group of every layer
        "KV cache holds 2.00 sequences of max_model_len 256 tokens at once: full attention (2 layers) 512 tokens",
    ]
    assert report.device_name.startswith("cpu (") and lines[5].startswith("engine ready in ")
    assert not any("CUDA graphs" in line for line in lines)


@pytest.mark.gpu
def test_a_cuda_engine_logs_its_graph_capture_time(qwen3_dir, caplog):
    caplog.set_level(logging.INFO, logger="nanovllm")
    llm = LLM(qwen3_dir, device="cuda", block_size=16, max_model_len=256, max_num_seqs=8)
    report = llm.client.info.start_up
    assert report.graph_capture_seconds > 0 and report.device_name.startswith("cuda:0 (")
    assert f"CUDA graphs captured in {report.graph_capture_seconds:.2f} s" in start_up_lines(caplog)
    llm.close()
