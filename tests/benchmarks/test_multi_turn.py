"""benchmarks/multi_turn.py with the test extras only (httpx, no aiohttp), against a stub server."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SERVED_NAME = "org/served-name"


class StubServer(BaseHTTPRequestHandler):
    """Answers what multi_turn.py asks: the model list, the prefix-cache counter, token counts, and chat
    completions of one streamed word; records the model name of every request it gets."""

    def do_GET(self):
        if self.path == "/v1/models":
            self._send("application/json", json.dumps({"object": "list", "data": [{"id": SERVED_NAME}]}))
        else:
            self._send("text/plain", "nanovllm:prefix_cache_hits_total 0.0\n")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.models_sent.append(body["model"])
        if self.path == "/tokenize":
            self._send("application/json", json.dumps({"count": 7}))
            return
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "word"}}]},
            {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}},
        ]
        self._send("text/event-stream", "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n")

    def _send(self, content_type: str, text: str) -> None:
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def stub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubServer)
    server.models_sent = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_help_needs_no_aiohttp():
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "multi_turn.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "--served-model-name" in result.stdout


def test_a_running_server_is_asked_for_its_model_name(stub_url, monkeypatch, capsys):
    server, url = stub_url
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import multi_turn

    multi_turn.main(["--base-url", url, "--conversations", "2", "--turns", "2", "--max-tokens", "1"])
    assert server.models_sent == [SERVED_NAME] * 5  # the system prompt's count, then 2 chats x 2 turns
    assert "2 conversations x 2 turns: 40 prompt tokens, 27 reusable" in capsys.readouterr().out
