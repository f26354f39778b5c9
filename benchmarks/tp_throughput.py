"""Offline throughput of a dummy-weight Qwen3-8B shape at a given tensor_parallel_size (CUDA, bf16).

The standard offline workload: 256 requests drawn after `random.seed(0)`, each
prompt `randint(100, 1024)` random token ids (`randint(0, 10000)`), each
`max_tokens = randint(100, 1024)` (133,966 output tokens in all),
temperature 0.6, EOS ignored. The model has Qwen3-8B's shape (hidden 4096,
36 layers, 32 heads, 8 KV heads, head_dim 128, intermediate 12288, vocabulary
151936, untied LM head) with random weights and no tokenizer. Prints the output
tokens per second.

    .venv/bin/python benchmarks/tp_throughput.py --tp 2 [--num-requests 256] [--enforce-eager]
"""

import argparse
import json
import tempfile
import time
from random import randint, seed

from nanovllm import LLM, SamplingParams

QWEN3_8B_SHAPE = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "hidden_act": "silu", "attention_bias": False, "eos_token_id": 151645,
}


def workload(num_requests: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """The standard requests: all prompts are drawn first, then all lengths, from seed 0."""
    seed(0)
    prompts = [[randint(0, 10000) for _ in range(randint(100, 1024))] for _ in range(num_requests)]
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=randint(100, 1024))
              for _ in range(num_requests)]
    return prompts, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as model_dir:
        with open(f"{model_dir}/config.json", "w") as f:
            json.dump(QWEN3_8B_SHAPE, f)
        llm = LLM(model_dir, tensor_parallel_size=args.tp, load_format="dummy", skip_tokenizer_init=True,
                  enforce_eager=args.enforce_eager)
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
        prompts, params = workload(args.num_requests)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        llm.close()
    output_tokens = sum(p.max_tokens for p in params)
    print(f"Qwen3-8B shape, bf16, tensor_parallel_size={args.tp}, {args.num_requests} requests: "
          f"{output_tokens} output tokens in {elapsed:.2f} s = {output_tokens / elapsed:,.0f} tok/s")


if __name__ == "__main__":
    main()
