"""GPU offline throughput on the standard workload, beside the memory roofline and (optionally) a peer.

Workload: a Qwen3-0.6B-shaped model (bf16, dummy weights), 256 requests made
with random.seed(0): each prompt randint(100, 1024) random token ids below
10000, each max_tokens randint(100, 1024) (133,966 output tokens in all),
temperature 0.6, EOS ignored.

Roofline: every decode step reads all weights once and every running
sequence's whole KV cache once, at the GPU's HBM bandwidth (prefill counted as
free), so it is an upper bound no engine can pass. Also measured: one
sequence's decode latency (128-token prompt, 1024 new tokens).

    python benchmarks/throughput.py [--peer hf] [--enforce-eager] [--no-chunked-prefill] [--profile]
                                    [--model-shape 0.6b|8b] [--tensor-parallel-size N]
"""

import argparse
import json
import os
import random
import tempfile
import time

import torch

from nanovllm import LLM, SamplingParams

SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
# HBM bandwidth from the vendors' data sheets, bytes/s, by a substring of the device name
HBM_BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H100 NVL": 3.9e12, "H200": 4.8e12,
                 "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "A100-SXM4-40GB": 1.555e12}


def model_config(shape: str) -> dict:
    """config.json of a Qwen3 model of this shape."""
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
            "bos_token_id": 151643, "eos_token_id": 151645, **SHAPES[shape]}


def write_model_dir(shape: str) -> str:
    """A folder holding only config.json: weights are dummy and prompts are token ids."""
    path = tempfile.mkdtemp(prefix=f"qwen3-{shape}-shape-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model_config(shape), f)
    return path


def workload(num_seqs: int = 256) -> tuple[list[list[int]], list[int]]:
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(num_seqs)]
    max_tokens = [random.randint(100, 1024) for _ in range(num_seqs)]
    return prompts, max_tokens


def hbm_bandwidth() -> tuple[float, str]:
    name = torch.cuda.get_device_name()
    for key, bandwidth in HBM_BANDWIDTH.items():
        if key in name:
            return bandwidth, "data sheet"
    return copy_bandwidth(), "measured copy (device not in the data-sheet table)"


def copy_bandwidth(size_bytes: int = 1 << 32) -> float:
    """Bytes per second read + written by a large device-to-device copy."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * size_bytes * 10 / (time.perf_counter() - start)


def roofline_seconds(prompts: list[list[int]], max_tokens: list[int], weight_bytes: int,
                     kv_bytes_per_token: int, bandwidth: float) -> float:
    """Time of every decode step reading all weights and every running sequence's KV once.

    The first token of each request comes from its prefill; decode step s runs the
    requests with max_tokens > s, each holding prompt + s tokens.
    """
    prompt_lens = [len(p) for p in prompts]
    total = 0
    for step in range(1, max(max_tokens)):
        context = sum(p + step for p, m in zip(prompt_lens, max_tokens) if m > step)
        total += weight_bytes + context * kv_bytes_per_token
    return total / bandwidth


def model_bytes(shape: str) -> tuple[int, int]:
    """(weight bytes, KV bytes per token) of the bf16 model."""
    s = SHAPES[shape]
    h, layers, d = s["hidden_size"], s["num_hidden_layers"], s["head_dim"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * s["intermediate_size"] + 2 * h + 2 * d
    embeddings = 151936 * h * (1 if s["tie_word_embeddings"] else 2)
    return 2 * (embeddings + layers * per_layer + h), 2 * 2 * layers * kv


def run_nanovllm(model_dir: str, prompts, max_tokens, args) -> tuple[LLM, float, float]:
    """The engine, the workload's seconds, and the part of them spent in steps that carry prompt
    tokens (prefills, or with chunked prefill the mixed steps of decodes and prompt chunks)."""
    llm = LLM(model_dir, load_format="dummy", skip_tokenizer_init=True, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size, enable_chunked_prefill=not args.no_chunked_prefill)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8), use_tqdm=False)
    params = [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=m) for m in max_tokens]
    torch.cuda.synchronize()
    # the loop of LLM.generate, timing prefill and decode steps apart
    start = time.perf_counter()
    seqs = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    prefill = 0.0
    while not llm.is_finished():
        step_start = time.perf_counter()
        _, num_tokens = llm.step()
        if num_tokens > 0:
            prefill += time.perf_counter() - step_start
    elapsed = time.perf_counter() - start
    assert sum(seq.num_completion_tokens for seq in seqs) == sum(max_tokens)
    return llm, elapsed, prefill


def single_sequence_latency(llm: LLM) -> float:
    """Seconds per decode step of one request (128-token prompt, 1024 new tokens), prefill excluded."""
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=1024)
    llm.add_request([random.randint(0, 10000) for _ in range(128)], params)
    llm.step()
    start = time.perf_counter()
    steps = 0
    while not llm.is_finished():
        llm.step()
        steps += 1
    return (time.perf_counter() - start) / steps


def print_profile(label: str, steps) -> None:
    """Per-kernel GPU time of running `steps()`."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps()
        torch.cuda.synchronize()
    print(f"profile of {label}:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))


def profile_steps(llm: LLM, num_seqs: int) -> None:
    """Profiles the prefill of `num_seqs` workload prompts, then 32 of their decode steps."""
    prompts, _ = workload()
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=64)
    for p in prompts[:num_seqs]:
        llm.add_request(p, params)

    def prefill():
        # until every prompt is in the cache (with chunked prefill, partly prefilled ones run already)
        while llm.scheduler.waiting or any(not seq.num_completion_tokens for seq in llm.scheduler.running):
            llm.step()

    def decode():
        for _ in range(32):
            llm.step()

    print_profile(f"the prefill of {num_seqs} prompts", prefill)
    print_profile(f"32 decode steps of {num_seqs} sequences", decode)
    while not llm.is_finished():
        llm.step()


def run_hf_peer(model_dir: str, prompts, max_tokens) -> float:
    """Seconds for the same workload through transformers' continuous batching (paged attention)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="paged|sdpa")
    model = model.cuda().eval()
    generation_config = GenerationConfig(do_sample=True, temperature=0.6, top_k=0, top_p=1.0,
                                         max_new_tokens=max(max_tokens), eos_token_id=-1, pad_token_id=0)
    done = generated = 0
    with model.continuous_batching_context_manager(generation_config=generation_config, block=True,
                                                   timeout=10) as manager:
        start = time.perf_counter()
        for ids, m in zip(prompts, max_tokens):
            manager.add_request(ids, max_new_tokens=m, eos_token_id=-1)
        while done < len(prompts):
            result = manager.get_result(timeout=5)
            if result is not None and result.is_finished():
                done += 1
                generated += len(result.generated_tokens)
        elapsed = time.perf_counter() - start
    if generated != sum(max_tokens):
        print(f"note: transformers generated {generated} tokens, not {sum(max_tokens)}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=["hf"], help="also run the workload through this peer")
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default="0.6b")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-chunked-prefill", action="store_true",
                        help="whole-prompt prefill steps (enable_chunked_prefill=False)")
    parser.add_argument("--profile", action="store_true", help="print per-kernel GPU time of decode steps")
    args = parser.parse_args()

    model_dir = write_model_dir(args.model_shape)
    prompts, max_tokens = workload()
    total_out = sum(max_tokens)
    bandwidth, source = hbm_bandwidth()
    weight_bytes, kv_bytes = model_bytes(args.model_shape)
    weight_bytes //= args.tensor_parallel_size
    kv_bytes //= args.tensor_parallel_size
    roofline = total_out / roofline_seconds(prompts, max_tokens, weight_bytes, kv_bytes, bandwidth)
    print(f"machine: {torch.cuda.get_device_name()} x{args.tensor_parallel_size}, torch {torch.__version__}, "
          f"HBM {bandwidth / 1e12:.2f} TB/s per GPU ({source})")
    print(f"workload: Qwen3-{args.model_shape} shape, bf16, dummy weights, {len(prompts)} requests, "
          f"{sum(map(len, prompts)):,} prompt tokens, {total_out:,} output tokens, temperature 0.6")

    llm, elapsed, prefill = run_nanovllm(model_dir, prompts, max_tokens, args)
    tps = total_out / elapsed
    print(f"nanovllm: {tps:,.0f} output tok/s ({elapsed:.2f} s, of which steps with prompt tokens {prefill:.2f} s); "
          f"roofline {roofline:,.0f} tok/s; reached {tps / roofline:.0%}  [graphs "
          f"{'off' if args.enforce_eager else 'on'}, chunked prefill "
          f"{'on' if llm.config.enable_chunked_prefill else 'off'}, {llm.config.num_kvcache_blocks} KV blocks of "
          f"{llm.config.kvcache_block_size}]")
    step = single_sequence_latency(llm)
    floor = weight_bytes / bandwidth
    print(f"single sequence decode: {step * 1e3:.3f} ms/token ({1 / step:,.0f} tok/s); "
          f"roofline {floor * 1e3:.3f} ms/token (weights once per token)")
    if args.profile:
        profile_steps(llm, 1)
        profile_steps(llm, 256)
    if args.peer == "hf":
        del llm
        torch.cuda.empty_cache()
        peer = run_hf_peer(model_dir, prompts, max_tokens)
        print(f"transformers continuous batching (paged|sdpa): {total_out / peer:,.0f} output tok/s "
              f"({peer:.2f} s); nanovllm is {peer / elapsed:.1f}x faster")


if __name__ == "__main__":
    main()
