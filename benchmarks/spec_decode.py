"""Speculative decoding with n-gram proposals: what it gains where answers copy from the prompt, and what it
costs where nothing is accepted, each against plain decoding in the same run.

CPU (`--device cpu`): the bundled SmolLM2-135M-Instruct with its real weights
and chat template, one request at a time (batch 1), greedy, 128 new tokens;
the prompts give a passage of Article I of the US Constitution
(benchmarks/texts/) and ask for it repeated, lightly edited or quoted, so the
answers copy from the prompt; the two engines take turns prompt by prompt,
so that a drift of the machine's speed weighs on both. Printed: output tok/s without and with
speculation, their ratio, the share of drafts kept and the tokens a step with
drafts emits, and whether the greedy outputs are identical.

GPU (default): a model shape (`--model-shape`, dummy weights, the Qwen3
tokenizer, as `throughput.py` runs it), where drafts are rarely kept, so the
figures measure the mechanism's cost: one sequence's ms/token (128-token
prompt, 1024 new tokens) and the standard workload's output tok/s (k = 2),
each without and with speculation. The n-gram lookup finds few matches in
dummy-weight text, so one sequence also runs with a stand-in proposer that
proposes k tokens at every step (the last token repeated, as good as always
rejected), with the pause after fruitless drafts off (`Scheduler.pause_fruitless_drafts`):
the cost of a verify step, against a plain decode step.

    python benchmarks/spec_decode.py [--device cpu] [--model-shape SHAPE] [-k K]
"""

import argparse
import gc
import os
import statistics
import time

from nanovllm import LLM, SamplingParams
from nanovllm.spec_decode.proposer import Proposer

TEXT = os.path.join(os.path.dirname(__file__), "texts", "us_constitution_article_1.txt")
TASKS = [
    "Repeat the following text exactly, word for word:\n\n{passage}",
    "Rewrite the following text with every 'shall' replaced by 'must', changing nothing else:\n\n{passage}",
    "Quote the first two sentences of the following text:\n\n{passage}",
    "Copy the following text and put it in quotation marks:\n\n{passage}",
]


def ngram(k: int) -> dict:
    """vLLM's n-gram speculative config: k drafts, looked up with n from 1 to 4."""
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}


class EveryStepProposer(Proposer):
    """Proposes as many drafts as fit, the last confirmed token repeated, at every step: every step of a
    request is then a verify step."""

    proposes_ahead = True

    def __init__(self, num_speculative_tokens: int):
        self.num_speculative_tokens = num_speculative_tokens

    def propose(self, token_ids, max_drafts, request_ids):
        return [[ids[-1]] * k for ids, k in zip(token_ids, max_drafts)]


def acceptance(llm: LLM) -> str:
    """The share of drafts kept and the tokens a step with drafts emitted, from the engine's counters."""
    stats = llm.client.stats()
    if not stats.spec_decode_num_drafts:
        return "no drafts proposed"
    rate = stats.spec_decode_num_accepted_tokens / stats.spec_decode_num_draft_tokens
    per_step = (stats.spec_decode_num_accepted_tokens + stats.spec_decode_num_drafts) / stats.spec_decode_num_drafts
    return (
        f"{stats.spec_decode_num_draft_tokens} drafts in {stats.spec_decode_num_drafts} request-steps, "
        f"{rate:.1%} kept, {per_step:.2f} tokens per step with drafts"
    )


def passages(num: int, words: int = 120) -> list[str]:
    """`num` passages of about `words` words from the text, one after another."""
    text = open(TEXT).read().split()
    return [" ".join(text[i * words : (i + 1) * words]) for i in range(num)]


def answer(llm: LLM, prompt: str, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds the chat prompt's greedy answer takes, and its token ids."""
    start = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)
    return time.perf_counter() - start, out[0].outputs[0].token_ids


def run_cpu(k: int, max_tokens: int = 128) -> None:
    from nanovllm.default_model import default_model_dir

    model = default_model_dir()
    prompts = [task.format(passage=p) for task, p in zip(TASKS * 2, passages(2 * len(TASKS)))]
    print(f"machine: CPU ({os.cpu_count()} cores); SmolLM2-135M-Instruct, real weights, fp32; batch 1, greedy")
    engines = {"plain": LLM(model, device="cpu"), "spec": LLM(model, device="cpu", speculative_config=ngram(k))}
    seconds, tokens, ids = dict.fromkeys(engines, 0.0), dict.fromkeys(engines, 0), {name: [] for name in engines}
    for name, llm in engines.items():
        answer(llm, prompts[0], 8)  # warm-up
    for i, prompt in enumerate(prompts):
        # the two engines take turns, each going first every other prompt, so that a drift of the machine's
        # speed weighs on both alike
        for name in list(engines)[:: 1 if i % 2 == 0 else -1]:
            elapsed, answer_ids = answer(engines[name], prompt, max_tokens)
            seconds[name] += elapsed
            tokens[name] += len(answer_ids)
            ids[name].append(answer_ids)
    plain, spec = (tokens[name] / seconds[name] for name in engines)
    print(f"plain decoding: {plain:.1f} output tok/s")
    print(f"n-gram, k = {k}: {spec:.1f} output tok/s ({acceptance(engines['spec'])})")
    print(f"speed-up {spec / plain:.2f}x; greedy outputs identical: {ids['plain'] == ids['spec']}")
    for llm in engines.values():
        llm.close()


def measure_gpu(
    model: str, config: dict | None, single: bool, load: bool, prompts, max_tokens, every_step: bool = False
) -> dict:
    """One engine's figures: one sequence's seconds per token, the workload's output tok/s (each if asked);
    `every_step`: drafts at every step (`EveryStepProposer`) rather than the n-gram lookup's."""
    from throughput import StepRecorder, single_sequence_latency

    label = "plain" if config is None else f"n-gram k={config['num_speculative_tokens']}"
    llm = LLM(model, load_format="dummy", **({} if config is None else {"speculative_config": config}))
    if every_step:
        label = f"drafts at every step, k={config['num_speculative_tokens']}"
        llm.client.core.scheduler.proposer = EveryStepProposer(config["num_speculative_tokens"])
        llm.client.core.scheduler.pause_fruitless_drafts = False
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
    results = {}
    if single:
        results["single"], summary = single_sequence_latency(llm)
        print(f"{label}: one sequence {results['single'] * 1e3:.3f} ms/token ({acceptance(llm)})\n{summary}")
    if load:
        params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
        recorder = StepRecorder(llm)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        results["workload"] = sum(max_tokens) / (time.perf_counter() - start)
        recorder.detach()
        gpu = statistics.median(r.gpu_ms for r in recorder.records)
        rate = results["workload"]
        print(f"{label}: workload {rate:,.0f} output tok/s, median step {gpu:.2f} ms ({acceptance(llm)})")
    llm.close()
    return results


def run_gpu(shape: str, k: int) -> None:
    import torch
    from throughput import add_qwen3_tokenizer, workload, write_model_dir

    model = write_model_dir(shape)
    add_qwen3_tokenizer(model)
    prompts, max_tokens = workload()
    print(f"machine: {torch.cuda.get_device_name()}; {shape} shape, dummy weights, Qwen3 tokenizer")
    runs = []
    for config, single, load, every_step in (
        (None, True, True, False),
        (ngram(k), True, False, False),
        (ngram(k), True, False, True),
        (ngram(2), False, True, False),
    ):
        runs.append(measure_gpu(model, config, single, load, prompts, max_tokens, every_step))
        gc.collect()  # the engine's cache goes only once nothing refers to it
        torch.cuda.empty_cache()
    plain, spec_k, every_k, spec_2 = runs
    print(f"one sequence, n-gram k={k} / plain: {spec_k['single'] / plain['single']:.2f}x")
    print(f"one sequence, a verify step of k={k} drafts / a decode step: {every_k['single'] / plain['single']:.2f}x")
    print(f"workload, n-gram k=2 / plain: {spec_2['workload'] / plain['workload']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model-shape", default="0.6b", help="GPU: a shape of model_shapes.py")
    parser.add_argument("-k", type=int, default=4, help="drafts per step (the workload also runs k = 2)")
    args = parser.parse_args()
    if args.device == "cpu":
        run_cpu(args.k)
    else:
        run_gpu(args.model_shape, args.k)


if __name__ == "__main__":
    main()
