"""CPU decode and prefill throughput: nanovllm against transformers, one run.

Decode: both engines decode the demo's templated chat prompts greedily for
exactly `--max-tokens` new tokens each (EOS ignored), in one batch, fp32.
Decode tok/s excludes the prefill: the time of a run that generates one token
is subtracted. The physical limit printed beside them is the memory roofline:
each decode step reads every weight once, at the copy bandwidth measured on
this machine.

Prefill: one prompt of `--prefill-tokens` random token ids (a new one each
repeat, so no prefix cache helps), nanovllm with its defaults (on the CPU a
long prompt is prefilled in chunks) asking for one token, transformers in one
forward pass. The physical limit is the compute roofline: two FLOPs per weight
per token at the matrix-multiply rate measured on this machine.

    .venv/bin/python benchmarks/cpu_chat.py [--model DIR] [--max-tokens 128] [--prefill-tokens 4000] [--repeats 3]
"""

import argparse
import os
import platform
import random
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import CHAT_QUESTIONS, chat_prompt, default_model_dir


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def copy_bandwidth(size_bytes: int = 1 << 30) -> float:
    """Bytes per second moved (read + write) by a large tensor copy."""
    src = torch.ones(size_bytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * size_bytes / best


def matmul_flops(n: int = 2048) -> float:
    """Floating-point operations per second of a large fp32 matrix multiply."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def nanovllm_decode_tps(llm: LLM, prompt_ids: list[list[int]], max_tokens: int, repeats: int) -> tuple[float, list]:
    """Best decode tok/s of `repeats` runs, and the completions."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    first_token = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def timed(sampling_params: SamplingParams):
        start = time.perf_counter()
        outputs = llm.generate(prompt_ids, sampling_params, use_tqdm=False)
        return time.perf_counter() - start, outputs

    best = 0.0
    for _ in range(repeats):
        prefill_time, _ = timed(first_token)
        total_time, outputs = timed(params)
        best = max(best, len(prompt_ids) * (max_tokens - 1) / (total_time - prefill_time))
    return best, [o.outputs[0].token_ids for o in outputs]


def nanovllm_prefill_tps(llm: LLM, prompts: list[list[int]]) -> float:
    """Best prefill tok/s over `prompts`, each one request for a single token."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    best = float("inf")
    for prompt in prompts:
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return len(prompts[0]) / best


def transformers_prefill_tps(model, prompts: list[list[int]]) -> float:
    """Best prefill tok/s over `prompts`, each one forward pass."""
    best = float("inf")
    with torch.inference_mode():
        for prompt in prompts:
            start = time.perf_counter()
            model(torch.tensor([prompt]))
            best = min(best, time.perf_counter() - start)
    return len(prompts[0]) / best


def transformers_decode_tps(
    model, tokenizer, prompt_ids: list[list[int]], max_tokens: int, repeats: int
) -> tuple[float, list]:
    """Best decode tok/s of `repeats` runs (left-padded batch), and the completions."""
    # Run through end-of-sequence tokens without forbidding them, as ignore_eos does.
    model.generation_config.eos_token_id = None
    batch = tokenizer.pad({"input_ids": prompt_ids}, return_tensors="pt")

    def timed(new_tokens: int):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        return time.perf_counter() - start, out

    timed(4)
    best = 0.0
    for _ in range(repeats):
        prefill_time, _ = timed(1)
        total_time, out = timed(max_tokens)
        best = max(best, len(prompt_ids) * (max_tokens - 1) / (total_time - prefill_time))
    width = batch["input_ids"].shape[1]
    return best, [row[width:].tolist() for row in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefill-tokens", type=int, default=4000, help="tokens of the prefill benchmark's prompt")
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine; the best counts")
    args = parser.parse_args()
    model_dir = args.model or default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    prompt_ids = [tokenizer.encode(chat_prompt(tokenizer, q), add_special_tokens=False) for q in CHAT_QUESTIONS]
    rng = random.Random(0)
    long_prompts = [
        [rng.randint(100, tokenizer.vocab_size - 1) for _ in range(args.prefill_tokens)] for _ in range(args.repeats)
    ]

    llm = LLM(model_dir, dtype="float32")
    ours, our_tokens = nanovllm_decode_tps(llm, prompt_ids, args.max_tokens, args.repeats)
    our_prefill = nanovllm_prefill_tps(llm, long_prompts)
    llm.close()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    peer, peer_tokens = transformers_decode_tps(model, tokenizer, prompt_ids, args.max_tokens, args.repeats)
    peer_prefill = transformers_prefill_tps(model, long_prompts)
    weight_bytes = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    bandwidth = copy_bandwidth()
    roofline = len(prompt_ids) * bandwidth / weight_bytes
    flops = matmul_flops()
    prefill_roofline = flops / (2 * weight_bytes / 4)  # fp32: 4 bytes per weight

    print(f"machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(
        f"workload: {len(prompt_ids)} chat prompts, {args.max_tokens} greedy new tokens each, fp32, one batch, "
        f"best of {args.repeats}"
    )
    print(f"nanovllm      decode: {ours:8.1f} tok/s")
    print(f"transformers  decode: {peer:8.1f} tok/s   (nanovllm / transformers = {ours / peer:.2f}x)")
    print(
        f"memory roofline:      {roofline:8.1f} tok/s   ({weight_bytes / 1e6:.0f} MB of weights per step at "
        f"{bandwidth / 1e9:.1f} GB/s copy bandwidth; nanovllm at {ours / roofline:.0%})"
    )
    print(
        f"nanovllm      prefill: {our_prefill:7.1f} tok/s   ({args.prefill_tokens:,}-token prompt, best of "
        f"{args.repeats}: {args.prefill_tokens / our_prefill:.1f} s)"
    )
    print(
        f"transformers  prefill: {peer_prefill:7.1f} tok/s   ({args.prefill_tokens / peer_prefill:.1f} s; "
        f"nanovllm takes {peer_prefill / our_prefill:.2f}x its time)"
    )
    print(
        f"compute roofline:      {prefill_roofline:7.1f} tok/s   (2 FLOPs per weight per token at "
        f"{flops / 1e9:.0f} GFLOP/s, a 2048x2048 fp32 matmul; attention left out)"
    )
    same = sum(a == b for a, b in zip(our_tokens, peer_tokens))
    print(f"identical greedy outputs: {same}/{len(prompt_ids)}")


if __name__ == "__main__":
    main()
