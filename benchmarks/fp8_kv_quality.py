"""Greedy agreement of the FP8 KV cache with a full-precision one, on real weights.

The bundled SmolLM2-135M-Instruct answers 16 chat prompts (64 greedy tokens
each, EOS ignored) once with kv_cache_dtype="auto" and once with "fp8" on the
same device; prints how many completions are token-identical and, for each
prompt, the index of the first token that differs (64: none).

    python benchmarks/fp8_kv_quality.py [--device cpu|cuda]
"""

import argparse

import torch

from nanovllm import LLM, SamplingParams
from nanovllm.default_model import chat_prompt, default_model_dir

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU does.",
    "What is photosynthesis?",
    "Name three primary colors.",
    "How do airplanes stay in the air?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Describe a cat in two sentences.",
    "Why is the sky blue?",
    "Suggest a name for a pet turtle.",
    "What does DNA stand for?",
    "Give one reason to learn a second language.",
    "What is the boiling point of water?",
    "Write a short greeting for a birthday card.",
]
MAX_TOKENS = 64


def completions(device: str, kv_cache_dtype: str) -> list[list[int]]:
    llm = LLM(
        default_model_dir(),
        device=device,
        block_size=16,
        num_kvcache_blocks=256,
        max_model_len=512,
        kv_cache_dtype=kv_cache_dtype,
    )
    prompts = [chat_prompt(llm.tokenizer, q) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), MAX_TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    full, fp8 = completions(device, "auto"), completions(device, "fp8")
    firsts = [first_difference(a, b) for a, b in zip(full, fp8)]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(
        f"machine: {name}, torch {torch.__version__}; SmolLM2-135M-Instruct, {len(QUESTIONS)} chat prompts, "
        f"{MAX_TOKENS} greedy tokens"
    )
    print(
        f"fp8 KV cache: {sum(f == MAX_TOKENS for f in firsts)}/{len(QUESTIONS)} completions identical to the "
        f"full-precision cache's; shortest identical start {min(firsts)} tokens"
    )
    print("first differing token per prompt: " + ", ".join(map(str, firsts)))


if __name__ == "__main__":
    main()
