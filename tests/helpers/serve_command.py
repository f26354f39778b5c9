"""`nanovllm serve` as a user starts it: the installed command, in a process of its own, on a free port."""

import os
import subprocess
import sys
import time

import httpx

from helpers.ports import free_port

# the engine of every server these tests start, but for the flags a test adds
SERVE_ENGINE_ARGS = dict(block_size=16, num_kvcache_blocks=32, max_model_len=256)


def nanovllm_command() -> list[str]:
    """The installed console script, next to this interpreter."""
    script = os.path.join(os.path.dirname(sys.executable), "nanovllm")
    assert os.path.isfile(script), "install the package (bash scripts/setup.sh) to get the nanovllm command"
    return [script]


def start_server(
    model: str,
    *flags: str,
    temp_dir: str | None = None,
    served_model_name: str | None = "tiny",
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """`nanovllm serve` on a free port, once /health answers 200: the process and its URL. With
    `temp_dir`, the server keeps its temporary files (the core's sockets) there; `env` adds to its
    environment."""
    port = free_port()
    engine_flags = [f"--{name.replace('_', '-')}={value}" for name, value in SERVE_ENGINE_ARGS.items()]
    name_flags = [] if served_model_name is None else ["--served-model-name", served_model_name]
    process = subprocess.Popen(
        nanovllm_command() + ["serve", model, "--port", str(port), *name_flags, *engine_flags, *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {}), **({} if temp_dir is None else {"TMPDIR": temp_dir})},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
