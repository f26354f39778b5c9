"""How long a long prompt stalls decoding streams on a CPU server: `nanovllm serve` with its defaults.

Workload: the bundled SmolLM2-135M-Instruct served on the CPU (fp32, default
settings). Eight streamed completions of the demo's chat questions decode
greedily (EOS ignored, special tokens kept in the text, so
every token streams a chunk); once each has streamed 10 chunks, a 4,000-token prompt
(random token ids) arrives asking for one token. Reported: the worst gap
between two streamed chunks of any decoding stream while the long prompt is
prefilled (the stall), the median gap before it arrived (a decode step of the
eight, the floor any prefill adds to), and the long prompt's time to first
token. The peer is transformers prefilling the same prompt in one forward
pass on the same machine: the stall of an engine that does not chunk prompts.

    .venv/bin/python benchmarks/cpu_serving_stall.py [--prompt-tokens 4000] [--server-args "..."]
"""

import argparse
import asyncio
import json
import random
import shlex
import statistics
import time

import httpx
import torch
from cpu_chat import cpu_name
from serving_common import start_server, wait_for_health
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanovllm.default_model import CHAT_QUESTIONS, chat_prompt, default_model_dir

NUM_STREAMS = 8
STEADY_CHUNKS = 10  # chunks each stream has before the long prompt arrives


async def stream(client: httpx.AsyncClient, url: str, prompt: str, times: list[float]) -> None:
    """Stream a greedy completion, appending the arrival time of every chunk with text."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": 4000,
        "temperature": 0.0,
        "ignore_eos": True,
        "skip_special_tokens": False,
        "stream": True,
    }
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())


async def measure(url: str, chat_prompts: list[str], long_prompt: list[int]) -> dict:
    """Chunk times of the decoding streams around the long prompt, and its time to first token."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
        # warm up the whole-prompt, chunked-prompt and decode paths
        warm = {"model": "bench", "prompt": long_prompt[:600], "max_tokens": 4, "ignore_eos": True}
        (await client.post(f"{url}/v1/completions", json=warm)).raise_for_status()
        times = [[] for _ in range(NUM_STREAMS)]
        streams = [
            asyncio.create_task(stream(client, url, chat_prompts[i % len(chat_prompts)], times[i]))
            for i in range(NUM_STREAMS)
        ]
        while min(map(len, times)) < STEADY_CHUNKS:
            await asyncio.sleep(0.05)
        arrival = time.perf_counter()
        body = {"model": "bench", "prompt": long_prompt, "max_tokens": 1}
        (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()
        first_token = time.perf_counter()
        await asyncio.sleep(3.0)  # a few more chunks, so the gap spanning the first token is seen
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    before = [b - a for t in times for a, b in zip(t, t[1:]) if b < arrival]
    during = [b - a for t in times for a, b in zip(t, t[1:]) if b > arrival and a < first_token]
    return dict(stall=max(during), floor=statistics.median(before), ttft=first_token - arrival)


def transformers_prefill_seconds(model_dir: str, prompt: list[int]) -> float:
    """Best of two one-pass prefills of `prompt` by transformers, fp32."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    best = float("inf")
    with torch.inference_mode():
        model(ids[:, :64])
        for _ in range(2):
            start = time.perf_counter()
            model(ids)
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="tokens of the arriving prompt")
    parser.add_argument(
        "--server-args", default="", help="extra `nanovllm serve` flags, e.g. '--max-num-batched-tokens 512'"
    )
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat_prompts = [chat_prompt(tokenizer, q) for q in CHAT_QUESTIONS]
    long_prompt = [random.Random(0).randint(100, tokenizer.vocab_size - 1) for _ in range(args.prompt_tokens)]

    url = f"http://127.0.0.1:{args.port}"
    server = start_server(model_dir, args.port, ["--device", "cpu", *shlex.split(args.server_args)])
    try:
        wait_for_health(url, server, timeout=300)
        result = asyncio.run(measure(url, chat_prompts, long_prompt))
    finally:
        server.terminate()
        server.wait()
    peer = transformers_prefill_seconds(model_dir, long_prompt)

    print(f"machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(
        f"workload: {NUM_STREAMS} greedy streams decoding when a {args.prompt_tokens:,}-token prompt arrives; "
        f"server flags: {args.server_args or '(defaults)'}"
    )
    print(f"worst gap of a decoding stream while it is prefilled (stall): {result['stall']:6.2f} s")
    print(f"median gap before it arrived (one decode step, the floor):   {result['floor']:6.2f} s")
    print(f"its time to first token:                                     {result['ttft']:6.2f} s")
    print(f"transformers prefilling it in one pass (unchunked stall):    {peer:6.2f} s")


if __name__ == "__main__":
    main()
