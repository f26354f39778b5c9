"""Host time of the n-gram (prompt lookup) proposer per engine step, at batch 1 and at 256 requests.

Each request starts with a context of `--context` tokens and gains one token
per step, as a decoding request does; the proposer is asked once per step for
the whole batch, with the same lists (appended to in place, as the scheduler's
requests are) and the same request ids. The tokens are random ids from a
vocabulary of `--vocab` ids, with stretches copied from earlier in the same
request (about half of them), so that n-grams recur and drafts are found.

The first call sees every request for the first time (a proposer with state
per request indexes the whole history then); it is timed and printed on its
own. Then `--steps` steps are timed one by one: the mean and median ms per
step, against the bars of the issue (0.05 ms at batch 1, 0.3 ms at 256
requests), and the share of request-steps that got a draft. Only the
`propose` call is timed, not the appending of the new tokens. CPU only.

    python benchmarks/ngram_proposer.py [--batch 1 256] [--context 4000] [--steps 200] [-k 4] [--min-n 5] [--max-n 5]
"""

import argparse
import os
import platform
import random
import statistics
import sys
import time

from cpu_chat import cpu_name

from nanovllm.spec_decode.ngram_proposer import NgramProposer

BARS_MS = {1: 0.05, 256: 0.3}


def token_stream(rng: random.Random, length: int, vocab: int) -> list[int]:
    """`length` token ids: runs of random ids alternating with runs copied from earlier in the stream."""
    ids: list[int] = []
    while len(ids) < length:
        run = rng.randrange(20, 200)
        if len(ids) > 200 and rng.random() < 0.5:
            start = rng.randrange(len(ids) - run)
            ids.extend(ids[start : start + run])
        else:
            ids.extend(rng.randrange(vocab) for _ in range(run))
    return ids[:length]


def run(batch: int, args: argparse.Namespace) -> None:
    rng = random.Random(batch)
    # every request's tokens for the whole run; the lists the proposer sees grow by one of them per step
    streams = [token_stream(rng, args.context + args.steps, args.vocab) for _ in range(batch)]
    contexts = [stream[: args.context] for stream in streams]
    request_ids = [f"request-{i}" for i in range(batch)]
    max_drafts = [args.k] * batch
    proposer = NgramProposer(args.k, args.min_n, args.max_n)

    start = time.perf_counter()
    proposer.propose(contexts, max_drafts, request_ids)
    first_ms = (time.perf_counter() - start) * 1e3

    step_ms, with_drafts = [], 0
    for step in range(args.steps):
        for ids, stream in zip(contexts, streams):
            ids.append(stream[args.context + step])
        start = time.perf_counter()
        drafts = proposer.propose(contexts, max_drafts, request_ids)
        step_ms.append((time.perf_counter() - start) * 1e3)
        with_drafts += sum(1 for d in drafts if d)

    bar = BARS_MS.get(batch)
    verdict = "" if bar is None else f"  (bar {bar} ms: {'met' if statistics.median(step_ms) <= bar else 'MISSED'})"
    print(
        f"batch {batch:>4}: first call {first_ms:9.3f} ms | per step mean {statistics.mean(step_ms):.4f} ms, "
        f"median {statistics.median(step_ms):.4f} ms, max {max(step_ms):.3f} ms{verdict} | "
        f"drafts in {with_drafts / (batch * args.steps):.0%} of request-steps"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 256], help="numbers of requests, one run each")
    parser.add_argument("--context", type=int, default=4000, help="tokens each request has at the first call")
    parser.add_argument("--steps", type=int, default=200, help="timed steps after the first call")
    parser.add_argument("--vocab", type=int, default=151_936, help="token ids are drawn below this")
    parser.add_argument("-k", type=int, default=4, help="num_speculative_tokens (and max_drafts of every request)")
    parser.add_argument("--min-n", type=int, default=5)
    parser.add_argument("--max-n", type=int, default=5)
    args = parser.parse_args()
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, {sys.implementation.name} {platform.python_version()}; "
        f"context {args.context} tokens, +1 per step, {args.steps} steps, k={args.k}, n in [{args.min_n}, {args.max_n}]"
    )
    for batch in args.batch:
        run(batch, args)


if __name__ == "__main__":
    main()
