"""What the serving benchmarks share, with no HTTP client library beyond the standard one: starting
`nanovllm serve`, waiting until it answers, asking it for its model's name, and percentiles."""

import json
import math
import shlex
import subprocess
import sys
import time
import urllib.request


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q`th percentile of `values` (NaN for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def start_server(model_dir: str, port: int, extra_args: list[str]) -> subprocess.Popen:
    """`nanovllm serve` in the background, its model served as "bench", its output (the start-up log and
    one access-log line per request) in serve.log."""
    command = [
        sys.executable,
        "-m",
        "nanovllm",
        "serve",
        model_dir,
        "--port",
        str(port),
        "--served-model-name",
        "bench",
        *extra_args,
    ]
    print("starting:", shlex.join(command), "(output in serve.log)", file=sys.stderr)
    with open("serve.log", "w") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def wait_for_health(url: str, process: subprocess.Popen | None, timeout: float) -> None:
    """Return once the server at `url` answers /health with 200; exit if `process` ends or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            sys.exit(f"the server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"the server at {url} did not become healthy within {timeout:.0f} s")


def served_model_name(url: str) -> str:
    """The name the server at `url` serves its model under: the first model its /v1/models lists."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]
