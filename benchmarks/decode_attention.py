"""GPU decode-attention kernel: achieved HBM bandwidth per tile setting, beside the torch backend and the HBM peak.

Shapes are those of the throughput workload (Qwen3-0.6B: 16 heads, 8 KV heads,
head_dim 128, bf16, KV blocks of 256): all 256 sequences right after their
prefill, the same 512 steps later, one sequence of the latency figure, one
long context and a medium batch. The kernel starts the sequences longest
context first, as the engine runs it. Each kernel setting is timed with the L2
cache flushed; bandwidth counts the K and V bytes the batch must read. The
default tile is also timed at 1 to 32 context splits. Beside the data sheet's
HBM figure, a plain streaming read (torch's sum of 2 GB) shows what reads can
reach on the machine.

With `--kv-cache-dtype fp8` the same cache is quantized to FP8 (values and
per-head scales) and the settings are timed over it; each case also prints the
bf16 cache's default-tile time and the speed-up, and bandwidth counts the bytes
an FP8 cache holds (values and scales).

    python benchmarks/decode_attention.py [--kv-cache-dtype fp8]
"""

import argparse
import itertools
import random

import torch
import triton.testing
from throughput import hbm_bandwidth, workload

from nanovllm.kernels.fp8_kv import quantize_paged_cache
from nanovllm.kernels.torch_attention import TorchAttentionBackend
from nanovllm.kernels.triton_decode_attention import decode_attention, default_block_n, default_num_splits
from nanovllm.utils.context import Context

HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 256
DTYPE = torch.bfloat16


def cases() -> dict[str, list[int]]:
    """Context lengths per case."""
    after_prefill = [len(p) + 1 for p in workload()[0]]
    return {
        "256 seqs, after prefill": after_prefill,
        "256 seqs, 512 steps later": [n + 512 for n in after_prefill],
        "64 seqs x 4096": [4096] * 64,
        "1 seq x 1152": [1152],
        "1 seq x 16384": [16384],
    }


def paged_inputs(context_lens: list[int]) -> tuple:
    """A query per sequence, a cache whose blocks are handed out in random order, and the order the
    engine starts the sequences in."""
    blocks_per_seq = [(n + PAGE - 1) // PAGE for n in context_lens]
    num_blocks = sum(blocks_per_seq)
    order = torch.randperm(num_blocks).tolist()
    width = max(blocks_per_seq)
    tables, used = [], 0
    for n in blocks_per_seq:
        tables.append(order[used : used + n] + [-1] * (width - n))
        used += n
    q = torch.randn(len(context_lens), HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    k_cache = torch.randn(num_blocks, PAGE, KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.tensor(tables, dtype=torch.int32, device="cuda")
    lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, block_tables, lens, torch.argsort(lens, descending=True)


def streaming_read_bandwidth(size_bytes: int = 1 << 31) -> float:
    """Bytes per second a plain reduction reads from HBM."""
    data = torch.ones(size_bytes // 2, dtype=torch.bfloat16, device="cuda")
    return size_bytes / (triton.testing.do_bench(lambda: data.sum(dtype=torch.float32)) * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
    fp8 = parser.parse_args().kv_cache_dtype == "fp8"
    random.seed(0)
    torch.manual_seed(0)
    bandwidth, source = hbm_bandwidth()
    read = streaming_read_bandwidth()
    print(
        f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"HBM {bandwidth / 1e12:.2f} TB/s ({source}), a streaming read {read / 1e12:.2f} TB/s "
        f"({read / bandwidth:.0%}); KV cache {'fp8 + fp32 scales' if fp8 else 'bf16'}"
    )
    scale = HEAD_DIM**-0.5
    settings = list(itertools.product([32, 64, 128], [2, 4, 8], [1, 2, 3, 4]))
    totals = {s: 0.0 for s in settings}
    for name, context_lens in cases().items():
        q, k_cache, v_cache, block_tables, lens, order = paged_inputs(context_lens)
        bf16_bytes = 2 * sum(context_lens) * KV_HEADS * HEAD_DIM * k_cache.element_size()
        context = Context(
            is_prefill=False, max_seqlen_k=max(context_lens), context_lens=lens, block_tables=block_tables
        )
        scales = {}
        if fp8:
            bf16_ms = triton.testing.do_bench(
                lambda: decode_attention(q, k_cache, v_cache, block_tables, lens, scale, seq_order=order)
            )
            (k_cache, scales["k_scale"]), (v_cache, scales["v_scale"]) = map(quantize_paged_cache, (k_cache, v_cache))
        kv_bytes = 2 * sum(context_lens) * KV_HEADS * (HEAD_DIM * k_cache.element_size() + (4 if fp8 else 0))
        torch_ms = triton.testing.do_bench(
            lambda: TorchAttentionBackend().decode(q, k_cache, v_cache, context, scale, *scales.values())
        )
        splits = default_num_splits(len(context_lens), KV_HEADS, q.device)
        print(
            f"\n{name}: {kv_bytes / 1e6:.0f} MB of KV, {splits} splits; torch backend {torch_ms * 1e3:.0f} us; "
            f"HBM limit {kv_bytes / bandwidth * 1e6:.0f} us"
        )
        results = []
        for setting in settings:
            block_n, warps, stages = setting
            ms = triton.testing.do_bench(
                lambda: decode_attention(
                    q,
                    k_cache,
                    v_cache,
                    block_tables,
                    lens,
                    scale,
                    block_n=block_n,
                    num_warps=warps,
                    num_stages=stages,
                    seq_order=order,
                    **scales,
                )
            )
            totals[setting] += ms
            results.append((ms, setting))
        for ms, (block_n, warps, stages) in sorted(results)[:5]:
            print(
                f"  block_n={block_n:3d} warps={warps} stages={stages}: {ms * 1e3:7.1f} us, "
                f"{kv_bytes / ms / 1e6:6.0f} GB/s = {kv_bytes / ms / 1e-3 / bandwidth:.0%} of HBM"
            )
        default_setting = (default_block_n(fp8), 4, 2)
        default = next(ms for ms, s in results if s == default_setting)
        print(f"  current default {default_setting}: {default * 1e3:.1f} us")
        if fp8:
            print(
                f"  bf16 cache, current default: {bf16_ms * 1e3:.1f} us; fp8 is {bf16_ms / default:.2f}x faster "
                f"({bf16_bytes / default / 1e6:,.0f} GB/s of bf16 K/V equivalent)"
            )
        by_splits = {
            n: triton.testing.do_bench(
                lambda: decode_attention(
                    q, k_cache, v_cache, block_tables, lens, scale, num_splits=n, seq_order=order, **scales
                )
            )
            for n in (1, 2, 4, 8, 16, 32)
        }
        print(
            "  default tile by context splits: " + ", ".join(f"{n}: {ms * 1e3:.1f} us" for n, ms in by_splits.items())
        )
    best = min(totals, key=totals.get)
    print(f"\nbest over all cases (sum of times): block_n, warps, stages = {best}")


if __name__ == "__main__":
    main()
