"""CPU decode throughput on the demo's chat prompts: nanovllm against transformers, one run.

Both engines decode the same templated prompts greedily for exactly
`--max-tokens` new tokens each (EOS ignored), in one batch, fp32. Decode tok/s
excludes the prefill: the time of a run that generates one token is
subtracted. The physical limit printed beside them is
the memory roofline: each decode step reads every weight once, at the copy
bandwidth measured on this machine.

    .venv/bin/python benchmarks/cpu_chat.py [--model DIR] [--max-tokens 128] [--repeats 3]
"""

import argparse
import os
import platform
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


def nanovllm_decode_tps(model_dir: str, prompt_ids: list[list[int]], max_tokens: int,
                        repeats: int) -> tuple[float, list]:
    """Best decode tok/s of `repeats` runs, and the completions."""
    llm = LLM(model_dir, dtype="float32")
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


def transformers_decode_tps(model_dir: str, prompt_ids: list[list[int]], max_tokens: int,
                            repeats: int) -> tuple[float, list]:
    """Best decode tok/s of `repeats` runs (left-padded batch), and the completions."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # Run through end-of-sequence tokens without forbidding them, as ignore_eos does.
    model.generation_config.eos_token_id = None
    batch = tokenizer.pad({"input_ids": prompt_ids}, return_tensors="pt")

    def timed(new_tokens: int):
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
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
    parser.add_argument("--repeats", type=int, default=3, help="runs per engine; the best counts")
    args = parser.parse_args()
    model_dir = args.model or default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [tokenizer.encode(chat_prompt(tokenizer, q), add_special_tokens=False) for q in CHAT_QUESTIONS]

    ours, our_tokens = nanovllm_decode_tps(model_dir, prompt_ids, args.max_tokens, args.repeats)
    peer, peer_tokens = transformers_decode_tps(model_dir, prompt_ids, args.max_tokens, args.repeats)
    weight_bytes = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    bandwidth = copy_bandwidth()
    roofline = len(prompt_ids) * bandwidth / weight_bytes

    print(f"machine: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"workload: {len(prompt_ids)} chat prompts, {args.max_tokens} greedy new tokens each, fp32, one batch, "
          f"best of {args.repeats}")
    print(f"nanovllm      decode: {ours:8.1f} tok/s")
    print(f"transformers  decode: {peer:8.1f} tok/s   (nanovllm / transformers = {ours / peer:.2f}x)")
    print(f"memory roofline:      {roofline:8.1f} tok/s   ({weight_bytes / 1e6:.0f} MB of weights per step at "
          f"{bandwidth / 1e9:.1f} GB/s copy bandwidth; nanovllm at {ours / roofline:.0%})")
    same = sum(a == b for a, b in zip(our_tokens, peer_tokens))
    print(f"identical greedy outputs: {same}/{len(prompt_ids)}")


if __name__ == "__main__":
    main()
