"""How many long sequences the KV cache holds at once, with cache groups and with every layer kept as full
attention (`disable_hybrid_kv_cache_manager=True`), in one call.

Workload: a model shape from `model_shapes.py` (default Gemma-3-4B: five 1,024-token
sliding layers to one global layer), bf16, dummy weights, max_model_len 32,768.
Each engine reports its capacity (sequences of max_model_len tokens it holds at
once, and the tokens each kind of cache group then holds); then `--requests`
requests of max_model_len tokens each (a prompt of random token ids and
`--output-len` tokens drawn at temperature 0.6, ignore_eos) run through the
public API, and the benchmark prints the most requests that ran at once and the
preemptions. The physical limit is the KV memory itself: the bytes the cache
has, over what one sequence of max_model_len tokens needs in the layers that
read it (every token in a full layer, the window in a sliding one, nothing in
a layer that reads another layer's K/V), each layer at its own KV heads and
head size. First, without a GPU, the KV memory one sequence of max_model_len
tokens takes: what the grouped engine reserves for it, what its layers need,
and what it would take with every layer full attention and a cache of its
own.

    python benchmarks/kv_capacity.py [--model-shape gemma-3-4b] [--max-model-len 32768] [--output-len 1024]
                                     [--requests N]   # default: the grouped engine's capacity, rounded down
"""

import argparse
import math
import random
import time
from dataclasses import dataclass

import torch
from model_shapes import SHAPES
from throughput import write_model_dir
from transformers import AutoConfig

from nanovllm import LLM, SamplingParams
from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, SharedKV, SlidingWindow
from nanovllm.models.model_config import ModelConfig
from nanovllm.worker.kv_cache import KVCacheSpec, KVShape

BLOCK_SIZE = 16


def engine(model_dir: str, max_model_len: int, full_attention_only: bool) -> LLM:
    return LLM(
        model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
        disable_hybrid_kv_cache_manager=full_attention_only,
    )


def capacity_line(llm: LLM) -> str:
    info = llm.client.info
    groups = "; ".join(f"{g.kind} ({g.num_layers} layers): {g.tokens:,} tokens" for g in info.kv_groups)
    gib = info.start_up.kv_cache_bytes / 2**30
    return f"{info.max_concurrency:.2f} sequences of {info.max_model_len:,} tokens in {gib:.1f} GiB ({groups})"


@dataclass
class SequenceBytes:
    """The bf16 KV bytes of one sequence of max_model_len tokens: as the grouped engine reserves them (its
    blocks in every cache group, each as large as the widest group's), as its layers need them, and
    with every layer full attention and a cache of its own (a KV-shared layer at its source's shape)."""

    reserved: int
    needed: int
    all_full: int


def sequence_bytes(model_dir: str, max_model_len: int) -> SequenceBytes:
    specs = ModelConfig.from_hf(AutoConfig.from_pretrained(model_dir)).layer_specs
    needed = all_full = 0
    for spec in specs:
        own = specs[spec.source_layer] if isinstance(spec, SharedKV) else spec
        if not isinstance(own, FullAttention | SlidingWindow):
            continue  # a recurrent layer's state is no KV
        per_token = 2 * own.num_kv_heads * own.head_dim * 2  # K and V in bf16
        all_full += max_model_len * per_token
        if own is spec:
            tokens = max_model_len if isinstance(spec, FullAttention) else min(spec.window, max_model_len)
            needed += tokens * per_token
    layout = cache_layout(specs)
    slots = lambda shape: max(len(g.layers) for g in layout.groups if (g.spec.num_kv_heads, g.spec.head_dim) == shape)
    block = KVCacheSpec(torch.bfloat16, BLOCK_SIZE, tuple(KVShape(*shape, slots(shape)) for shape in layout.shapes))
    reserved = layout.blocks_held(max_model_len, BLOCK_SIZE, 0) * block.block_bytes
    return SequenceBytes(reserved, needed, all_full)


def run_requests(llm: LLM, num_requests: int, max_model_len: int, output_len: int) -> tuple[int, int, float]:
    """(most requests running at once, preemptions, seconds) for `num_requests` max_model_len-long requests."""
    random.seed(0)
    params = SamplingParams(temperature=0.6, max_tokens=output_len, ignore_eos=True)
    prompt_len = max_model_len - output_len
    for _ in range(num_requests):
        llm.add_request([random.randint(0, 10000) for _ in range(prompt_len)], params)
    most_running = 0
    start = time.perf_counter()
    while llm.has_unfinished_requests():
        llm.step()
        most_running = max(most_running, llm.client.stats().num_running)
    return most_running, llm.client.stats().num_preemptions, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-shape", default="gemma-3-4b", choices=sorted(SHAPES))
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=None)
    args = parser.parse_args()
    model_dir = write_model_dir(args.model_shape)
    one = sequence_bytes(model_dir, args.max_model_len)
    print(
        f"one sequence of {args.max_model_len:,} tokens: the grouped engine reserves {one.reserved / 2**30:.2f} GiB "
        f"of KV, its layers need {one.needed / 2**30:.2f} GiB; every layer full attention with a cache of its own "
        f"{one.all_full / 2**30:.2f} GiB (ratios {one.reserved / one.all_full:.3f} and {one.needed / one.all_full:.3f})"
    )
    print(f"device: {torch.cuda.get_device_name()}; shape {args.model_shape}, bf16, dummy weights")
    results = {}
    num_requests = args.requests
    for name, full_only in (("cache groups", False), ("every layer full attention", True)):
        llm = engine(model_dir, args.max_model_len, full_only)
        info = llm.client.info
        # both engines get the requests the grouped one holds
        num_requests = num_requests or max(1, math.floor(info.max_concurrency))
        running, preemptions, seconds = run_requests(llm, num_requests, args.max_model_len, args.output_len)
        limit = info.start_up.kv_cache_bytes / one.needed
        print(f"{name}: capacity {capacity_line(llm)}")
        print(
            f"  {num_requests} requests of {args.max_model_len:,} tokens: at most {running} at once, "
            f"{preemptions} preemptions, {seconds:.1f} s; physical limit {limit:.2f} sequences"
        )
        results[name] = (info.max_concurrency, running)
        llm.close()
        del llm
        torch.cuda.empty_cache()
    grouped, full = results["cache groups"], results["every layer full attention"]
    print(
        f"cache groups hold {grouped[0] / full[0]:.2f}x the sequences (capacity), "
        f"ran {grouped[1] / max(full[1], 1):.2f}x as many at once"
    )


if __name__ == "__main__":
    main()
