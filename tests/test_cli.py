"""The `nanovllm` command: argument parsing, and `nanovllm serve` as a real process."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.cli import build_parser

ENGINE_ARGS = dict(kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=256)


def test_serve_options_cover_config_fields():
    args = build_parser().parse_args(["serve", "/m", "--port", "9000", "--max-num-seqs", "8", "--enforce-eager",
                                      "--api-key", "k", "--gpu-memory-utilization", "0.5"])
    assert (args.model, args.port, args.max_num_seqs, args.enforce_eager) == ("/m", 9000, 8, True)
    assert (args.api_key, args.gpu_memory_utilization, args.tensor_parallel_size) == ("k", 0.5, 1)
    assert args.enable_chunked_prefill
    assert not build_parser().parse_args(["serve", "/m", "--no-enable-chunked-prefill"]).enable_chunked_prefill
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--max-num-seqs", "many"])


def nanovllm_command() -> list[str]:
    """The installed console script, next to this interpreter."""
    script = os.path.join(os.path.dirname(sys.executable), "nanovllm")
    assert os.path.isfile(script), "install the package (bash scripts/setup.sh) to get the nanovllm command"
    return [script]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_answers_completions_then_stops(qwen3_dir):
    port = free_port()
    engine_flags = [f"--{name.replace('_', '-')}={value}" for name, value in ENGINE_ARGS.items()]
    command = nanovllm_command() + ["serve", qwen3_dir, "--port", str(port), "--served-model-name", "tiny",
                                    *engine_flags]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        response = client.completions.create(model="tiny", prompt="w5 w6", max_tokens=4, temperature=0,
                                             extra_body={"ignore_eos": True})
        [want] = LLM(qwen3_dir, **ENGINE_ARGS).generate(["w5 w6"], SamplingParams(temperature=0.0, max_tokens=4,
                                                                                   ignore_eos=True), use_tqdm=False)
        assert response.choices[0].text == want.outputs[0].text and response.usage.completion_tokens == 4
    finally:
        process.terminate()
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in process.stdout.read()


def test_serve_reports_a_bad_model_folder(tmp_path):
    result = subprocess.run(nanovllm_command() + ["serve", str(tmp_path / "missing")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "does not exist" in result.stderr
