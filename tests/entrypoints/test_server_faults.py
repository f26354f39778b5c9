"""No request can wedge the server: out-of-range numbers are 400s, a fault while serving one request
ends that request only, a fault that stops the server turns /health to 503, and a shutdown ends the
streams it cuts with an error event."""

import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time

import httpx
import msgspec
import pytest
import uvicorn
import zmq

from nanovllm import LLM, SamplingParams, StructuredOutputsParams
from nanovllm.core import structured_output
from nanovllm.engine.core_client import remove_stale_socket_folders
from nanovllm.engine.core_process import BusyLoop
from nanovllm.engine.messages import EngineCoreOutputs, EngineCoreRequest, EngineCoreShutdown, EngineStats
from nanovllm.entrypoints import generation
from nanovllm.entrypoints.api_server import ServerSettings, _Server, build_app
from nanovllm.frontend import output_processor
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.api_servers import ENGINE_ARGS, MODEL, RunningServer, error_of, wait_until
from helpers.core_steps import core_steps
from helpers.processes import alive, child_processes
from helpers.serve_command import start_server

POISON = "poison"  # a stop string that the patched output processing fails on


@pytest.fixture(scope="module")
def server(chat_model_dir):
    running = RunningServer(chat_model_dir, ServerSettings(MODEL), step_seconds=0.005)
    yield running
    running.close()


@pytest.fixture
def poisoned_requests(monkeypatch):
    """Output processing fails for every request with the stop string POISON, as a detokenizer fault would."""
    update = output_processor.RequestState.update

    def failing_update(self, output):
        if POISON in self.params.stop:
            raise RuntimeError("simulated fault in one request's output")
        return update(self, output)

    monkeypatch.setattr(output_processor.RequestState, "update", failing_update)


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "w5 w6 w7", "max_tokens": 8, **fields}


def events_of(response: httpx.Response) -> list[dict | str]:
    """The SSE payloads of a streamed response: dicts, and the closing '[DONE]'."""
    payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [payload if payload == "[DONE]" else json.loads(payload) for payload in payloads]


def assert_serves(client: httpx.Client, url: str) -> None:
    """A normal request on the same connection is served, and nothing is left running."""
    response = client.post(f"{url}/v1/completions", json=completion(temperature=0, ignore_eos=True))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8
    assert client.get(f"{url}/health").status_code == 200


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"n": 2, "seed": 2**64 - 1, "temperature": 1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"top_k": 2**64}, "top_k"),
        ({"top_k": 2**63}, "top_k"),
        ({"min_tokens": 2**70}, "min_tokens"),
        ({"max_tokens": 2**64}, "max_tokens"),
        ({"stop_token_ids": [2**64]}, "stop_token_ids"),
        ({"logit_bias": {str(2**64): 1}}, "logit_bias"),
        ({"n": 2**64}, "n"),
        ({"best_of": 2**63}, "best_of"),
        ({"logprobs": 2**64}, "logprob"),
    ],
)
def test_integers_out_of_range_are_a_400_naming_the_field(server, fields, name):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post("/v1/completions", json=completion(**fields))
        assert response.status_code == 400, response.text
        assert name in error_of(response)["message"]
        assert_serves(client, server.url)
    wait_until(lambda: server.online.stats().num_running == 0)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"stop": ["w9"] * 65}, "stop"),
        ({"stop_token_ids": [5] * 1025}, "stop_token_ids"),
        ({"prompt": ["w5"] * 600, "n": 2}, "1200 completions"),
    ],
)
def test_lists_beyond_the_servers_limits_are_a_400(server, fields, message):
    response = httpx.post(f"{server.url}/v1/completions", json=completion(**fields), timeout=30)
    assert response.status_code == 400 and message in error_of(response)["message"]


def test_seeds_at_the_64_bit_bounds_are_served_and_repeat(server):
    for seed in (2**63 - 1, -(2**63)):
        body = completion(n=3, seed=seed, temperature=1.0)
        first = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
        again = httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)
        assert first.status_code == again.status_code == 200, first.text
        assert [c["text"] for c in first.json()["choices"]] == [c["text"] for c in again.json()["choices"]]


def test_a_fault_in_one_requests_output_ends_only_that_request(server, poisoned_requests):
    results = {}

    def long_stream():
        body = completion(
            max_tokens=60, ignore_eos=True, temperature=0, stream=True, stream_options={"include_usage": True}
        )
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
            results["long"] = events_of(response)

    reader = threading.Thread(target=long_stream)
    reader.start()
    wait_until(lambda: server.online.stats().num_running == 1)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        plain = client.post("/v1/completions", json=completion(stop=[POISON]))
        assert plain.status_code == 500 and "failed while running this request" in error_of(plain)["message"]
        with client.stream("POST", "/v1/completions", json=completion(stop=[POISON], stream=True)) as response:
            events = events_of(response)
        assert events[-1]["error"]["code"] == 500
        assert_serves(client, server.url)
    reader.join()
    *chunks, usage, done = results["long"]
    assert done == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 60
    wait_until(lambda: server.online.stats().num_running == 0)


def test_an_unexpected_error_is_one_500_and_the_connection_goes_on(server, monkeypatch, caplog):
    def broken(self, *args, **kwargs):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(generation._Completions, "choice", broken)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with caplog.at_level(logging.ERROR):
            response = client.post("/v1/completions", json=completion())
        assert response.status_code == 500 and error_of(response)["type"] == "server_error"
        assert len([r for r in caplog.records if r.exc_info]) == 1  # logged once, not twice
        with client.stream("POST", "/v1/completions", json=completion(stream=True)) as streamed:
            events = events_of(streamed)
        assert streamed.status_code == 200 and events[-1]["error"]["code"] == 500
        monkeypatch.undo()
        assert_serves(client, server.url)  # on the same keep-alive connection
    wait_until(lambda: server.online.stats().num_running == 0)


@pytest.mark.slow
def test_a_fault_in_the_output_thread_turns_health_to_503(chat_model_dir, monkeypatch):
    running = RunningServer(chat_model_dir, ServerSettings(MODEL), step_seconds=0.005)
    try:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            body = completion(max_tokens=500, ignore_eos=True, stream=True)
            with client.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))
                monkeypatch.setattr(output_processor.OutputProcessor, "process", lambda self, outputs: 1 / 0)
                broken = time.monotonic()
                rest = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
            assert rest[-1]["error"]["code"] == 503
            wait_until(lambda: client.get("/health").status_code == 503, timeout=5)
            assert time.monotonic() - broken < 5
            refused = client.post("/v1/completions", json=completion())
            assert refused.status_code == 503
        assert "ZeroDivisionError" in running.online.failure
    finally:
        running.close()


@pytest.mark.slow
def test_streams_cut_by_the_shutdown_grace_period_get_an_error_event(chat_model_dir):
    with core_steps(0.005):
        online = OnlineEngine(chat_model_dir, **ENGINE_ARGS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        build_app(online, ServerSettings(MODEL)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )
    server = _Server(config, online, shutdown_timeout=0.5)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started)
    body = completion(max_tokens=1000, ignore_eos=True, stream=True)
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        server.handle_exit(signal.SIGTERM, None)
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == 503 and "shut down" in events[-1]["error"]["message"]
    assert sum(len(e["choices"][0]["text"].split()) for e in events[:-1]) < 1000
    thread.join(timeout=10)
    assert not thread.is_alive()
    online.shutdown()


@pytest.mark.slow
def test_the_socket_folder_of_a_killed_server_is_removed_at_the_next_start(qwen3_dir, tmp_path):
    process, _ = start_server(qwen3_dir, "--max-model-len=64", "--num-kvcache-blocks=16", temp_dir=str(tmp_path))
    [left] = list(tmp_path.glob("nanovllm-*"))
    [core] = child_processes(process.pid)
    process.kill()
    process.wait()
    wait_until(lambda: not alive(core))  # it exits with its parent
    assert left.exists()
    again, _ = start_server(qwen3_dir, "--max-model-len=64", "--num-kvcache-blocks=16", temp_dir=str(tmp_path))
    try:
        assert not left.exists()
        assert len(list(tmp_path.glob("nanovllm-*"))) == 1  # its own
    finally:
        again.terminate()
        again.wait(timeout=30)


def test_stale_socket_folders_of_dead_processes_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live, other = (
        tmp_path / f"nanovllm-{dead.pid}-abc",
        tmp_path / f"nanovllm-{os.getpid()}-def",
        tmp_path / "nanovllm-cache",
    )
    for folder in (stale, live, other):
        folder.mkdir()
    remove_stale_socket_folders()
    assert not stale.exists() and live.exists() and other.exists()


def test_a_grammar_fault_in_the_core_ends_only_that_request(chat_model_dir, monkeypatch):
    llm = LLM(chat_model_dir, **ENGINE_ARGS)
    try:

        def failing_accept(self, request_id, token_id):
            raise RuntimeError("simulated grammar fault")

        monkeypatch.setattr(structured_output.StructuredOutputs, "accept", failing_accept)
        constrained = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(regex="(w5 )+"))
        plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        failed, served = llm.generate(["w5 w6", "w5 w6"], [constrained, plain], use_tqdm=False)
        assert failed.outputs[0].finish_reason == "error"
        assert served.outputs[0].finish_reason == "length" and len(served.outputs[0].token_ids) == 8
    finally:
        llm.close()


class _RefusingCore:
    """An engine core that cannot take the request 'bad' (as when its grammar fails to compile)."""

    def __init__(self):
        self.taken = []

    def add_request(self, request):
        if request.request_id == "bad":
            raise RuntimeError("simulated compile failure")
        self.taken.append(request.request_id)

    def has_work(self):
        return False

    def stats(self):
        return EngineStats()


def test_a_request_the_core_process_cannot_take_ends_with_an_error_and_the_loop_goes_on():
    context = zmq.Context()
    try:
        requests_in, requests_out = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        outputs_in, outputs_out = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        requests_in.bind("inproc://requests")
        requests_out.connect("inproc://requests")
        outputs_out.bind("inproc://outputs")
        outputs_in.connect("inproc://outputs")
        core = _RefusingCore()
        loop = BusyLoop(core, requests_out, outputs_in)
        encoder = msgspec.msgpack.Encoder()
        for request_id in ("bad", "good"):
            requests_in.send(encoder.encode(EngineCoreRequest(request_id, [5], SamplingParams())))
        requests_in.send(encoder.encode(EngineCoreShutdown()))
        assert not loop._take_messages()  # it reached the shutdown
        sent = msgspec.msgpack.Decoder(EngineCoreOutputs).decode(outputs_out.recv())
        assert [(o.request_id, o.finish_reason) for o in sent.outputs] == [("bad", "error")]
        assert core.taken == ["good"]
    finally:
        context.destroy(linger=0)
