"""An OpenAI-compatible server in a thread of the test process, serving an online engine on a tiny model, and
what its tests read from its answers."""

import socket
import threading
import time

import httpx
import openai
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from nanovllm.entrypoints.api_server import ServerSettings, build_app
from nanovllm.frontend.online_engine import OnlineEngine

from helpers.core_steps import core_steps

MODEL = "tiny"
BLOCK = 16
# 64 blocks of 16 tokens: room for the concurrency test, and a 600-token prompt fills more than half;
# whole prompts in one step, so a second such prompt waits for blocks instead of starting in chunks
ENGINE_ARGS = dict(block_size=BLOCK, num_kvcache_blocks=64, max_model_len=1024, max_num_batched_tokens=1024)


class RunningServer:
    """A uvicorn server in a thread, serving an online engine whose core steps take `step_seconds`
    longer (so that tests can act mid-generation) and whose `failing_step`-th step fails; stopped by
    `close`."""

    def __init__(
        self,
        model_dir: str,
        settings: ServerSettings,
        step_seconds: float = 0.0,
        failing_step: int | None = None,
        **engine_args,
    ):
        with core_steps(step_seconds, failing_step):
            self.online = OnlineEngine(model_dir, **{**ENGINE_ARGS, **engine_args})
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(build_app(self.online, settings), host="127.0.0.1", port=port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started)

    def client(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def metric(self, name: str, headers=None, **labels) -> float:
        """The sum of the /metrics samples called `name` that carry `labels`."""
        return read_metric(self.url, name, headers, **labels)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.online.shutdown()


def read_metric(url: str, name: str, headers=None, **labels) -> float:
    """The sum of the /metrics samples called `name` that carry `labels`, of the server at `url`."""
    text = httpx.get(f"{url}/metrics", headers=headers).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def wait_until(condition, timeout=20.0):
    """Return once `condition()` holds; fail the test when it still does not after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def error_of(response: httpx.Response) -> dict:
    """The error object of an error response, which must carry a message, a type and a code."""
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "code"}
    return body["error"]
