"""The `nanovllm` command: argument parsing, and `nanovllm serve` as a real process."""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version

import httpx
import openai
import pytest

from nanovllm import LLM, SamplingParams
from nanovllm.cli import build_parser

from helpers.hub_cache import add_to_cache
from helpers.processes import alive, child_processes
from helpers.serve_command import SERVE_ENGINE_ARGS, nanovllm_command, start_server


def test_serve_options_cover_config_fields():
    args = build_parser().parse_args(
        [
            "serve",
            "/m",
            "--port",
            "9000",
            "--max-num-seqs",
            "8",
            "--enforce-eager",
            "--api-key",
            "k",
            "--gpu-memory-utilization",
            "0.5",
        ]
    )
    assert (args.model, args.port, args.max_num_seqs, args.enforce_eager) == ("/m", 9000, 8, True)
    assert (args.api_key, args.gpu_memory_utilization, args.tensor_parallel_size) == ("k", 0.5, 1)
    assert args.enable_chunked_prefill
    assert not build_parser().parse_args(["serve", "/m", "--no-enable-chunked-prefill"]).enable_chunked_prefill
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--max-num-seqs", "many"])


def serve_actions() -> list[argparse.Action]:
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices["serve"]._actions


def test_every_serve_flag_says_what_it_does():
    for action in serve_actions():
        assert action.help and action.help.strip(), f"{action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    "flag, meaning",
    [
        ("--max-model-len", "-1: the model's max_position_embeddings"),
        ("--num-kvcache-blocks", "-1: as many as memory holds"),
        ("--max-num-batched-tokens", "-1: 16384 on CUDA, 256 on the CPU"),
        ("--master-port", "0: $MASTER_PORT if set, else a free port"),
        ("--shutdown-timeout", "0: end them at once"),
        ("--block-size", "unset or -1: 16 (256 with"),
    ],
)
def test_flags_say_what_their_special_values_mean(flag, meaning):
    [action] = [a for a in serve_actions() if flag in a.option_strings]
    assert meaning in action.help


def test_serve_help_imports_neither_torch_nor_transformers():
    # the console script's own module, run as it runs: parse, print the help, exit
    code = (
        "import sys\n"
        "from nanovllm.cli import main\n"
        "try:\n    main(['serve', '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--enable-prefix-caching" in result.stdout and result.stdout.splitlines()[-1] == "[]"


def test_a_bad_flag_is_refused_before_anything_loads():
    code = (
        "import sys\n"
        "from nanovllm.cli import main\n"
        "try:\n    main(['serve', '/m', '--max-num-seqs', 'many'])\nexcept SystemExit as e:\n"
        "    print(e.code, 'torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "2 False" and "invalid int value: 'many'" in result.stderr


def test_python_m_nanovllm_runs_the_nanovllm_command():
    result = subprocess.run(
        [sys.executable, "-m", "nanovllm", "serve", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: nanovllm serve") and "--block-size BLOCK_SIZE" in result.stdout
    assert "NANOVLLM_LOGGING_LEVEL" in result.stdout  # the environment it reads is documented there


def test_version_prints_the_package_version():
    result = subprocess.run(nanovllm_command() + ["--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"nanovllm {version('nanovllm')}"


def test_prefix_caching_flags_come_from_the_config_field():
    assert build_parser().parse_args(["serve", "/m"]).enable_prefix_caching
    assert not build_parser().parse_args(["serve", "/m", "--no-enable-prefix-caching"]).enable_prefix_caching


@pytest.mark.slow
def test_serve_answers_completions_then_stops(qwen3_dir):
    process, url = start_server(qwen3_dir)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        response = client.completions.create(
            model="tiny", prompt="w5 w6", max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        [want] = LLM(qwen3_dir, **SERVE_ENGINE_ARGS).generate(
            ["w5 w6"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
        )
        assert response.choices[0].text == want.outputs[0].text and response.usage.completion_tokens == 4
    finally:
        process.terminate()
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    log = process.stdout.read()
    assert "Application shutdown complete" in log
    assert "KV cache: 512 tokens in 32 blocks of 16 tokens (float32, " in log  # the dtype start-up chose, not 'auto'
    assert f"serving 'tiny' at {url} (the OpenAI API under /v1)" in log


@pytest.mark.slow
def test_serve_resolves_a_hub_id_from_the_cache_and_logs_its_start_up(qwen3_dir, tmp_path):
    snapshot = add_to_cache(tmp_path / "hub", "tiny-org/tiny-qwen3", qwen3_dir)
    offline = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    process, url = start_server("tiny-org/tiny-qwen3", served_model_name=None, env=offline)
    try:
        # the public name is the id as given
        assert [card["id"] for card in httpx.get(f"{url}/v1/models").json()["data"]] == ["tiny-org/tiny-qwen3"]
    finally:
        process.terminate()
        process.wait(timeout=30)
    log = process.stdout.read()
    for line in (
        f"model: tiny-org/tiny-qwen3 (folder {snapshot})",
        "architecture Qwen3ForCausalLM, dtype float32, device cpu (",
        "weights: ",
        "KV cache: 512 tokens in 32 blocks of 16 tokens (float32, ",
        "engine ready in ",
        f"serving 'tiny-org/tiny-qwen3' at {url} (the OpenAI API under /v1)",
    ):
        assert line in log, log


@pytest.mark.slow
def test_serve_reports_a_port_in_use_before_loading_the_model(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # the folder does not exist either: the port is checked first
        result = subprocess.run(
            nanovllm_command() + ["serve", str(tmp_path / "missing"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert f"nanovllm serve: cannot listen on 127.0.0.1:{port}: Address already in use; pick another --port" in (
        result.stderr
    )


@pytest.mark.slow
def test_serve_reports_a_bad_model_folder(tmp_path):
    result = subprocess.run(
        nanovllm_command() + ["serve", str(tmp_path / "missing")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and "does not exist" in result.stderr


def stream_body(max_tokens: int) -> dict:
    return {"model": "tiny", "prompt": "w5 w6", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}


@pytest.mark.slow
def test_serve_is_two_processes_and_a_graceful_stop_lets_a_stream_finish(qwen3_dir, tmp_path):
    process, url = start_server(qwen3_dir, "--max-model-len=1024", "--num-kvcache-blocks=128", temp_dir=str(tmp_path))
    [core] = child_processes(process.pid)
    assert sorted(path.name for path in tmp_path.glob("nanovllm-*/*")) == ["outputs", "requests"]
    with httpx.stream("POST", f"{url}/v1/completions", json=stream_body(1000), timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.TransportError):  # no new connections while it drains
            httpx.get(f"{url}/health")
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1].get("choices", [{}])[0].get("finish_reason") == "length", (events[-1], process.stdout.read())
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not alive(core)
    assert list(tmp_path.iterdir()) == []  # the core's socket files went with it


@pytest.mark.slow
def test_a_killed_core_ends_streams_with_an_error_and_serve_exits(qwen3_dir):
    process, url = start_server(qwen3_dir, "--max-model-len=1024", "--num-kvcache-blocks=128")
    [core] = child_processes(process.pid)
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{url}/v1/completions", json=stream_body(1000)) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            os.kill(core, signal.SIGKILL)
            killed = time.monotonic()
            rest = [line for line in lines if line.startswith("data:")]
        assert "error" in json.loads(rest[-1][6:])
        assert client.get(f"{url}/health").status_code == 503
        assert time.monotonic() - killed < 5
    assert process.wait(timeout=15) == 1
    assert "the engine cannot go on (the engine core process exited unexpectedly" in process.stdout.read()


@pytest.mark.slow
def test_serve_reports_the_core_start_up_error(qwen3_dir, tmp_path):
    # the folder's tokenizer and config, without weights: the core process fails while loading
    for name in os.listdir(qwen3_dir):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(qwen3_dir, name), tmp_path / name)
    result = subprocess.run(nanovllm_command() + ["serve", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "safetensors" in result.stderr


def test_serve_takes_vllms_chat_template_and_tool_flags(monkeypatch, capsys):
    args = build_parser().parse_args(
        ["serve", "/m", "--chat-template", "t.jinja", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    )
    assert (args.chat_template, args.enable_auto_tool_choice, args.tool_call_parser) == ("t.jinja", True, "hermes")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "/m", "--tool-call-parser", "pythonic"])
    assert "choose from 'hermes', 'qwen3_coder', 'llama3_json', 'mistral'" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "/m", "--tool-call-parser", "mistral"]).tool_call_parser == "mistral"
    from nanovllm import cli
    from nanovllm.entrypoints import api_server

    seen = {}
    monkeypatch.setattr(api_server, "serve", lambda **kwargs: seen.update(kwargs))
    cli.main(["serve", "/m", "--chat-template", "{{ 'x' }}"])
    assert (seen["chat_template"], seen["enable_auto_tool_choice"], seen["tool_call_parser"]) == (
        "{{ 'x' }}",
        False,
        "hermes",
    )
