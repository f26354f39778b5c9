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

With `--sliding SHAPE` it times instead the decode attention of a sliding layer
of that model shape (its heads, head_dim, window and soft-cap) at contexts of
the window's length, 4,000 tokens and longer, for 1, 64 and 256 sequences: a
sliding layer reads only its window, so its time should not grow with the
context.

With `--sinks SHAPE` it times the decode attention of that model shape's layers
(gpt-oss-20b: 64 heads, 8 KV heads, head_dim 64; full and 128-token sliding)
with and without a sink logit per head, in one CUDA graph each, for the
workload's cases: the sink is one more term of each row's softmax, applied once
when a row's sum is final, so it should cost next to nothing.

With `--kv-cache-dtype fp8` the same cache is quantized to FP8 (values and
per-head scales) and the settings are timed over it; each case also prints the
bf16 cache's default-tile time and the speed-up, and bandwidth counts the bytes
an FP8 cache holds (values and scales).

With `--head-dim`, `--heads` and `--kv-heads` the tile sweep runs at another
layer shape, e.g. Gemma 4's global layers (head_dim 512, 8 query heads on one KV
head); settings whose tiles do not fit an SM's shared memory are reported and
skipped.

    python benchmarks/decode_attention.py [--kv-cache-dtype fp8] [--sliding gemma-3-4b] [--sinks gpt-oss-20b]
    python benchmarks/decode_attention.py --head-dim 512 --heads 8 --kv-heads 1 [--kv-cache-dtype fp8]
"""

import argparse
import itertools
import random

import torch
import triton.testing
from model_shapes import SHAPES
from throughput import hbm_bandwidth, workload
from triton.runtime.errors import OutOfResources

from nanovllm.kernels.fp8_kv import quantize_paged_cache
from nanovllm.kernels.torch_attention import TorchAttentionBackend
from nanovllm.kernels.triton_attention_tile_shapes import decode_tiles
from nanovllm.kernels.triton_decode_attention import decode_attention, default_num_splits
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


def paged_inputs(
    context_lens: list[int], heads: int = HEADS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM
) -> tuple:
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
    q = torch.randn(len(context_lens), heads, head_dim, dtype=DTYPE, device="cuda")
    k_cache = torch.randn(num_blocks, PAGE, kv_heads, head_dim, dtype=DTYPE, device="cuda")
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.tensor(tables, dtype=torch.int32, device="cuda")
    lens = torch.tensor(context_lens, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, block_tables, lens, torch.argsort(lens, descending=True)


def streaming_read_bandwidth(size_bytes: int = 1 << 31) -> float:
    """Bytes per second a plain reduction reads from HBM."""
    data = torch.ones(size_bytes // 2, dtype=torch.bfloat16, device="cuda")
    return size_bytes / (triton.testing.do_bench(lambda: data.sum(dtype=torch.float32)) * 1e-3)


def sliding_layer(shape: str) -> None:
    """The decode attention of one sliding layer of `shape` at contexts up to 16,384 tokens."""
    c = SHAPES[shape]
    heads, kv_heads, head_dim, window = (
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["sliding_window"],
    )
    softcap = c.get("attn_logit_softcapping")
    print(
        f"{shape} sliding layer: {heads} heads, {kv_heads} KV heads, head_dim {head_dim}, window {window}, "
        f"soft-cap {softcap}; bf16 cache; time in a CUDA graph by context"
    )

    def time_at(num_seqs: int, context: int) -> float:
        q, k_cache, v_cache, block_tables, lens, order = paged_inputs([context] * num_seqs, heads, kv_heads, head_dim)
        # in a CUDA graph, as the engine runs it: one sequence's kernels take less time than their launch
        return triton.testing.do_bench_cudagraph(
            lambda: decode_attention(
                q, k_cache, v_cache, block_tables, lens, head_dim**-0.5, seq_order=order, window=window, softcap=softcap
            )
        )

    for num_seqs in (1, 64, 256):
        # 256 sequences of 16,384 tokens would not fit beside their window-length copy
        contexts = sorted({window, 4000, 2 * window, 16384 if num_seqs <= 64 else 8192})
        times = {n: time_at(num_seqs, n) for n in contexts}
        window_bytes = 2 * num_seqs * window * kv_heads * head_dim * 2
        print(
            f"  {num_seqs:3d} seqs: "
            + ", ".join(f"{n:,} tokens {ms * 1e3:.1f} us ({ms / times[window]:.2f}x)" for n, ms in times.items())
            + f"; the window's KV read at HBM peak {window_bytes / hbm_bandwidth()[0] * 1e6:.1f} us"
        )


def sinks_cost(shape: str) -> None:
    """The decode attention of `shape`'s full and sliding layers with and without sinks, by case."""
    c = SHAPES[shape]
    heads, kv_heads, head_dim = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    print(
        f"{shape}: {heads} heads, {kv_heads} KV heads, head_dim {head_dim}; bf16 cache; "
        "time in a CUDA graph without and with sinks"
    )
    sinks = torch.randn(heads, dtype=torch.float32, device="cuda")
    ratios = []
    for window in (None, c["sliding_window"]):
        for name, context_lens in cases().items():
            q, k_cache, v_cache, block_tables, lens, order = paged_inputs(context_lens, heads, kv_heads, head_dim)

            def time_with(layer_sinks: torch.Tensor | None) -> float:
                return triton.testing.do_bench_cudagraph(
                    lambda: decode_attention(
                        q,
                        k_cache,
                        v_cache,
                        block_tables,
                        lens,
                        head_dim**-0.5,
                        seq_order=order,
                        window=window,
                        sinks=layer_sinks,
                    )
                )

            plain, with_sinks = time_with(None), time_with(sinks)
            ratios.append(with_sinks / plain)
            print(
                f"  {'window ' + str(window) if window else 'full':>10}, {name}: {plain * 1e3:.1f} us without, "
                f"{with_sinks * 1e3:.1f} us with sinks ({with_sinks / plain - 1:+.1%})"
            )
    print(f"sinks cost at most {max(ratios) - 1:+.1%} (median {sorted(ratios)[len(ratios) // 2] - 1:+.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kv-cache-dtype", choices=["auto", "fp8"], default="auto")
    parser.add_argument("--sliding", choices=[s for s in SHAPES if SHAPES[s].get("sliding_window")])
    parser.add_argument("--sinks", choices=[s for s in SHAPES if SHAPES[s].get("model_type") == "gpt_oss"])
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--heads", type=int, default=HEADS)
    parser.add_argument("--kv-heads", type=int, default=KV_HEADS)
    args = parser.parse_args()
    fp8 = args.kv_cache_dtype == "fp8"
    random.seed(0)
    torch.manual_seed(0)
    if args.sinks:
        print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        sinks_cost(args.sinks)
        return
    if args.sliding:
        print(f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}")
        sliding_layer(args.sliding)
        return
    tile_sweep(fp8, args.heads, args.kv_heads, args.head_dim)


def tile_sweep(fp8: bool, heads: int, kv_heads: int, head_dim: int) -> None:
    """Every case's time under each tile setting, the best five and the default's, and by context splits."""
    bandwidth, source = hbm_bandwidth()
    read = streaming_read_bandwidth()
    print(
        f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"HBM {bandwidth / 1e12:.2f} TB/s ({source}), a streaming read {read / 1e12:.2f} TB/s "
        f"({read / bandwidth:.0%}); KV cache {'fp8 + fp32 scales' if fp8 else 'bf16'}; "
        f"{heads} heads, {kv_heads} KV heads, head_dim {head_dim}"
    )
    scale = head_dim**-0.5
    block_ns = [16, 32, 64] if head_dim > 256 else [32, 64, 128]
    settings = list(itertools.product(block_ns, [2, 4, 8], [1, 2, 3, 4]))
    totals = {s: 0.0 for s in settings}
    for name, context_lens in cases().items():
        q, k_cache, v_cache, block_tables, lens, order = paged_inputs(context_lens, heads, kv_heads, head_dim)
        bf16_bytes = 2 * sum(context_lens) * kv_heads * head_dim * k_cache.element_size()
        context = Context(
            is_prefill=False, max_seqlen_k=max(context_lens), context_lens=lens, block_tables=block_tables
        )
        scales = {}
        if fp8:
            bf16_ms = triton.testing.do_bench(
                lambda: decode_attention(q, k_cache, v_cache, block_tables, lens, scale, seq_order=order)
            )
            (k_cache, scales["k_scale"]), (v_cache, scales["v_scale"]) = map(quantize_paged_cache, (k_cache, v_cache))
        kv_bytes = 2 * sum(context_lens) * kv_heads * (head_dim * k_cache.element_size() + (4 if fp8 else 0))
        torch_ms = triton.testing.do_bench(
            lambda: TorchAttentionBackend().decode(q, k_cache, v_cache, context, scale, *scales.values())
        )
        splits = default_num_splits(len(context_lens), kv_heads, q.device)
        print(
            f"\n{name}: {kv_bytes / 1e6:.0f} MB of KV, {splits} splits; torch backend {torch_ms * 1e3:.0f} us; "
            f"HBM limit {kv_bytes / bandwidth * 1e6:.0f} us"
        )
        results = []
        for setting in settings:
            block_n, warps, stages = setting
            try:
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
            except OutOfResources as error:  # tiles too large for the SM at this head_dim
                print(f"  block_n={block_n:3d} warps={warps} stages={stages}: does not fit ({error})")
                ms = float("inf")
            totals[setting] += ms
            results.append((ms, setting))
        for ms, (block_n, warps, stages) in sorted(results)[:5]:
            print(
                f"  block_n={block_n:3d} warps={warps} stages={stages}: {ms * 1e3:7.1f} us, "
                f"{kv_bytes / ms / 1e6:6.0f} GB/s = {kv_bytes / ms / 1e-3 / bandwidth:.0%} of HBM"
            )
        tiles = decode_tiles(head_dim, DTYPE, fp8, heads // kv_heads)
        default = triton.testing.do_bench(
            lambda: decode_attention(q, k_cache, v_cache, block_tables, lens, scale, seq_order=order, **scales)
        )
        print(
            f"  current default (block_n, warps, stages) = {(tiles.block_n, tiles.num_warps, tiles.num_stages)}: "
            f"{default * 1e3:.1f} us"
        )
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
