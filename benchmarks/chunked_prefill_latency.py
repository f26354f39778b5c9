"""Inter-token latency of decoding sequences while a long prompt arrives, with chunked prefill on and off.

Workload: a Qwen3-0.6B-shaped model (bf16, dummy weights, CUDA). 64 requests
(128 random prompt tokens each, EOS ignored) are prefilled and decode for 32
steps; then a 16,384-token prompt arrives. Every step's end is timestamped, and
each decoding sequence's inter-token latency is the time between two of its
tokens. Reported over the window from the long prompt's arrival until 32 steps
after its first token: the median, p99 and worst inter-token latency of the 64
decoding sequences, and the long prompt's time to first token.

With chunked prefill off the long prompt is one step of 16k tokens, which every
decode waits for; with it on the prompt is absorbed `--budget` tokens at a time
beside the decodes.

    python benchmarks/chunked_prefill_latency.py [--budget 2048] [--long-prompt 16384] [--skip-throughput]

Then it runs benchmarks/throughput.py's workload with chunking on (default
budget) and off and prints both output rates, which should agree within noise;
`--skip-throughput` leaves that out.
"""

import argparse
import random
import time
from types import SimpleNamespace

import numpy as np
import torch
from throughput import make_llm, run_workload, workload, write_model_dir

from nanovllm import LLM, RequestOutput, SamplingParams

NUM_DECODING = 64
SHORT_PROMPT = 128
STEADY_STEPS = 32  # decode steps before the long prompt arrives, and after its first token
ENGINE = dict(load_format="dummy", skip_tokenizer_init=True, max_num_seqs=NUM_DECODING + 1)


def random_prompt(n: int) -> list[int]:
    return [random.randint(0, 10000) for _ in range(n)]


def warm_up(llm: LLM) -> None:
    """Compile every kernel variant the measurement runs: whole prompts, chunks over a cached
    prefix beside decodes, and the decode graphs."""
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=8)
    for _ in range(2):
        llm.add_request(random_prompt(SHORT_PROMPT), params)
    llm.step()
    config = llm.config
    long = min(config.token_budget + 100, config.context_len - 8)  # two chunks when chunking
    llm.add_request(random_prompt(long), SamplingParams(ignore_eos=True, max_tokens=2))
    while llm.has_unfinished_requests():
        llm.step()


def measure(llm: LLM, long_prompt: int) -> tuple[list[float], float]:
    """The decoding sequences' inter-token latencies (seconds) in the window around the long
    prompt, and the long prompt's time to first token."""
    # enough tokens that the decodes outlast the window
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=1024)
    decoding = [llm.add_request(random_prompt(SHORT_PROMPT), params) for _ in range(NUM_DECODING)]
    counts = dict.fromkeys(decoding, 0)  # tokens each decoding request has

    def step() -> dict[str, RequestOutput]:
        """One step; the outputs of the requests it advanced, by request id."""
        return {out.request_id: out for out in llm.step()}

    def tokens(outputs: dict[str, RequestOutput]) -> dict[str, int]:
        return {r: len(out.outputs[0].token_ids) for r, out in outputs.items() if r in counts}

    while not all(counts.values()):
        counts.update(tokens(step()))
    for _ in range(STEADY_STEPS):
        counts.update(tokens(step()))
    arrival = last_token_at = time.perf_counter()
    long = llm.add_request(
        random_prompt(long_prompt), SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=STEADY_STEPS + 1)
    )
    latencies = []
    first_token_at = long_finished = None
    while not long_finished:
        advanced = step()
        now = time.perf_counter()  # the step returned the tokens of the one before it: a user sees them now
        grown = tokens(advanced)
        if grown:
            assert all(grown.get(r) == n + 1 for r, n in counts.items()), "every decode gets its token"
            latencies += [now - last_token_at] * NUM_DECODING
            last_token_at = now
            counts.update(grown)
        if long in advanced:
            first_token_at = first_token_at or now
            long_finished = advanced[long].finished
    return latencies, first_token_at - arrival


def run(model_dir: str, chunked: bool, budget: int, long_prompt: int) -> dict:
    max_model_len = long_prompt + 2 * STEADY_STEPS + 8
    if not chunked:
        budget = max_model_len  # a whole prompt must fit one step
    llm = LLM(
        model_dir, enable_chunked_prefill=chunked, max_num_batched_tokens=budget, max_model_len=max_model_len, **ENGINE
    )
    warm_up(llm)
    latencies, ttft = measure(llm, long_prompt)
    del llm
    torch.cuda.empty_cache()
    ms = np.array(latencies) * 1e3
    return dict(budget=budget, p50=np.percentile(ms, 50), p99=np.percentile(ms, 99), worst=ms.max(), ttft=ttft * 1e3)


def throughput(model_dir: str, chunked: bool) -> float:
    """Output tok/s of benchmarks/throughput.py's workload."""
    prompts, max_tokens = workload()
    args = SimpleNamespace(enforce_eager=False, tensor_parallel_size=1, no_chunked_prefill=not chunked)
    llm = make_llm(model_dir, args, skip_tokenizer_init=True)
    elapsed, _ = run_workload(llm, prompts, max_tokens)
    del llm
    torch.cuda.empty_cache()
    return sum(max_tokens) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens with chunking on")
    parser.add_argument("--long-prompt", type=int, default=16384, help="tokens of the arriving prompt")
    parser.add_argument(
        "--skip-throughput",
        action="store_true",
        help="do not compare the throughput workload's tok/s with chunking on and off",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    random.seed(0)
    model_dir = write_model_dir("0.6b")
    print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(
        f"workload: Qwen3-0.6B shape, bf16, dummy weights; {NUM_DECODING} sequences ({SHORT_PROMPT}-token "
        f"prompts) decoding when a {args.long_prompt:,}-token prompt arrives"
    )
    print(f"{'chunked prefill':<16} {'budget':>8} {'ITL p50':>9} {'ITL p99':>9} {'ITL worst':>10} {'long TTFT':>10}")
    for chunked in (True, False):
        r = run(model_dir, chunked, args.budget, args.long_prompt)
        print(
            f"{'on' if chunked else 'off':<16} {r['budget']:>8} {r['p50']:>7.1f}ms {r['p99']:>7.1f}ms "
            f"{r['worst']:>8.1f}ms {r['ttft']:>8.1f}ms"
        )
    if not args.skip_throughput:
        rates = {chunked: throughput(model_dir, chunked) for chunked in (True, False)}
        print(
            f"throughput workload: {rates[True]:,.0f} output tok/s with chunked prefill on (default budget), "
            f"{rates[False]:,.0f} off ({rates[True] / rates[False] - 1:+.1%})"
        )


if __name__ == "__main__":
    main()
