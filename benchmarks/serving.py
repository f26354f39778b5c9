"""Online serving benchmark: Poisson arrivals against `nanovllm serve`, streamed, at several rates.

Each request is a random token-id prompt of randint(100, 1024) tokens asking for
randint(100, 1024) new tokens (EOS ignored, temperature 0.6): the throughput
workload's lengths. Requests arrive as a Poisson process at each `--rates`
value (requests per second; `inf` sends them all at once). For every rate it
reports request and token throughput, time to first token (TTFT),
inter-token latency (ITL, the gaps between streamed chunks) and end-to-end
latency percentiles, then prints one table over all rates.

Without `--model` and `--base-url` it writes a Qwen3-0.6B-shaped folder
(config.json and a stand-in tokenizer covering the whole vocabulary) and
serves it with random weights (`--load-format dummy`), so no weights are
needed:

    python benchmarks/serving.py --rates 2 8 32 inf --num-prompts 200

`--model DIR` serves another folder (add `--server-args "--load-format dummy"`
for random weights); `--base-url http://host:port` measures a server that is
already running.
"""

import argparse
import asyncio
import json
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx
from throughput import model_config


def write_dummy_model(path: str) -> None:
    """config.json of Qwen3-0.6B and a word-level tokenizer with one word per token id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = model_config("0.6b")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    eos = config["eos_token_id"]
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    vocab["<eos>"] = vocab.pop(f"w{eos}")
    core = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="w0", eos_token="<eos>").save_pretrained(path)


@dataclass
class RequestResult:
    """What one streamed request saw."""

    ok: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                      max_tokens: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result = RequestResult(prompt_tokens=len(prompt))
    start = last = time.perf_counter()
    finish_reason = None
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    finish_reason = chunk["choices"][0].get("finish_reason") or finish_reason
                if chunk.get("choices") and chunk["choices"][0]["text"]:
                    now = time.perf_counter()
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        # EOS is ignored, so a healthy request ends by length with every token it asked for
        result.ok = finish_reason == "length" and result.output_tokens == max_tokens
        if not result.ok:
            result.error = f"finished with {finish_reason!r} after {result.output_tokens}/{max_tokens} tokens"
    except httpx.HTTPError as e:
        result.error = repr(e)
    return result


async def run_at_rate(url: str, model: str, workload: list[tuple[list[int], int]], rate: float,
                      seed: int) -> tuple[list[RequestResult], float]:
    """Send the workload with exponential gaps of mean 1/rate; returns results and wall time."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for prompt, max_tokens in workload:
            tasks.append(asyncio.create_task(one_request(client, url, model, prompt, max_tokens)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def summarize(rate: float, results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    ttfts = [r.ttft for r in done]
    itls = [gap for r in done for gap in r.itls]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    row = {"rate": rate, "completed": len(done), "failed": len(results) - len(done), "duration_s": duration,
           "req_per_s": len(done) / duration, "output_tok_per_s": output_tokens / duration,
           "total_tok_per_s": (output_tokens + prompt_tokens) / duration}
    for name, values in (("ttft_ms", ttfts), ("itl_ms", itls), ("e2e_ms", [r.latency for r in done])):
        row[f"{name}_mean"] = 1000 * sum(values) / len(values) if values else float("nan")
        for q in (50, 90, 99):
            row[f"{name}_p{q}"] = 1000 * percentile(values, q)
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"  {len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    return row


def make_workload(num_prompts: int, vocab_size: int, input_len: tuple[int, int], output_len: tuple[int, int],
                  seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    top = min(vocab_size, 10000) - 1
    return [([rng.randint(0, top) for _ in range(rng.randint(*input_len))], rng.randint(*output_len))
            for _ in range(num_prompts)]


def start_server(model_dir: str, port: int, extra_args: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "nanovllm.cli", "serve", model_dir, "--port", str(port),
               "--served-model-name", "bench", *extra_args]
    print("starting:", shlex.join(command), file=sys.stderr)
    return subprocess.Popen(command)


def wait_for_health(url: str, process: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            sys.exit(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    sys.exit(f"the server at {url} did not become healthy within {timeout:.0f} s")


COLUMNS = [("rate", "rate", "{}"), ("done", "completed", "{}"), ("req/s", "req_per_s", "{:.2f}"),
           ("out tok/s", "output_tok_per_s", "{:,.0f}"), ("tot tok/s", "total_tok_per_s", "{:,.0f}"),
           ("TTFT p50", "ttft_ms_p50", "{:.0f}"), ("TTFT p90", "ttft_ms_p90", "{:.0f}"),
           ("TTFT p99", "ttft_ms_p99", "{:.0f}"), ("ITL p50", "itl_ms_p50", "{:.1f}"),
           ("ITL p90", "itl_ms_p90", "{:.1f}"), ("ITL p99", "itl_ms_p99", "{:.1f}"),
           ("E2E p50", "e2e_ms_p50", "{:.0f}"), ("E2E p99", "e2e_ms_p99", "{:.0f}")]


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(title for title, _, _ in COLUMNS) + " |  (latencies in ms)")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model folder to serve (default: a dummy Qwen3-0.6B shape)")
    parser.add_argument("--base-url", help="measure this running server instead of starting one")
    parser.add_argument("--served-model-name", default="bench", help="the model name, with --base-url")
    parser.add_argument("--rates", nargs="+", type=float, default=[2, 8, 32, math.inf],
                        help="arrival rates in requests/s; inf sends everything at once")
    parser.add_argument("--num-prompts", type=int, default=200, help="requests per rate")
    parser.add_argument("--input-len", nargs=2, type=int, default=[100, 1024], metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", nargs=2, type=int, default=[100, 1024], metavar=("MIN", "MAX"))
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--server-args", default="", help="extra `nanovllm serve` options, one string")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", help="also write the rows to this JSON file")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    process = None
    with tempfile.TemporaryDirectory() as scratch:
        if args.base_url:
            url, model_name, vocab_size = args.base_url.rstrip("/"), args.served_model_name, 10000
        else:
            model_dir, extra = args.model, shlex.split(args.server_args)
            if model_dir is None:
                model_dir = scratch
                write_dummy_model(model_dir)
                extra = ["--load-format", "dummy", *extra]
            with open(os.path.join(model_dir, "config.json")) as f:
                vocab_size = json.load(f)["vocab_size"]
            url, model_name = f"http://127.0.0.1:{args.port}", "bench"
            process = start_server(model_dir, args.port, extra)
        try:
            wait_for_health(url, process, args.startup_timeout)
            rows = []
            for i, rate in enumerate(args.rates):
                workload = make_workload(args.num_prompts, vocab_size, tuple(args.input_len), tuple(args.output_len),
                                         args.seed + i)
                results, duration = asyncio.run(run_at_rate(url, model_name, workload, rate, args.seed + i))
                rows.append(summarize(rate, results, duration))
                print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=60)
    print_table(rows)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
