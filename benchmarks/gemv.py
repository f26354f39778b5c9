"""The matrix products of a decode step of a few rows: nanovllm's Triton GEMV beside cuBLAS (F.linear).

For each projection of a decoder layer of each model shape asked for (Qwen3-0.6B
and Qwen3-8B by default) and its LM head (bf16; one row, or each row count of `--rows`: a verify step
of k drafts has k + 1) it times the product as a decode step runs it, with the
steps fused into it (one row: the norm in front of qkv and gate/up, the
activation in front of down; several rows: the norm in front of qkv and
gate/up, the activation behind gate/up), beside the same steps in torch and
cuBLAS. It
prints the HBM bandwidth that reading the weight once at that speed means,
beside the data-sheet peak. As in a decode step, products run back to back in
a CUDA graph, each on a different copy of the weight (copies of 256 MB in all,
so none is read from L2), and the time includes the gaps between them.
`--sweep` also times each BLOCK_N, BLOCK_K and warp count (and pipeline stages, for several rows; for one row of
FP8 weights, the tiles of `triton_gemv.FP8_TILES`) and prints the best per shape and row count.
`--tensor-parallel-size N` times one rank's share of each product instead (q/k/v, gate/up and the LM head
split by output features, o and down by input features; the KV heads repeated where N exceeds them).
`--fp8` times the products with the weights in FP8 (a byte per weight; per-channel scales, or with
`--fp8 128x128` one scale per block of 128 x 128 as block-FP8 checkpoints hold them) instead, beside the same
torch + cuBLAS bf16 product.

    python benchmarks/gemv.py [--sweep] [--fp8 [per-channel | 128x128]] [--rows 1 5 16] [--shapes 0.6b 8b ...]
                              [--tensor-parallel-size N]
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
from model_shapes import SHAPES
from throughput import hbm_bandwidth

from nanovllm.kernels import triton_gemv
from nanovllm.kernels.fp8_weights import quantize_blocks
from nanovllm.layers.activation import gated_activation
from nanovllm.layers.layernorm import rms_norm
from nanovllm.utils.parallel import kv_heads_per_rank

EPS = 1e-6


def hidden_act(shape: str) -> str:
    """The MLP's gated activation of `shape` (Gemma's configs name it hidden_activation)."""
    c = SHAPES[shape]
    return c.get("hidden_activation") or c["hidden_act"]


def projections(shape: str, rows: int, ranks: int = 1) -> dict[str, tuple[int, int, str]]:
    """(output features, input features, what is fused into it) of each projection of one decoder layer in a
    step of `rows` rows, and of the LM head: on one of `ranks` tensor-parallel ranks, its share."""
    c = SHAPES[shape]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_heads, _ = kv_heads_per_rank(c["num_key_value_heads"], ranks)
    q, kv = c["num_attention_heads"] // ranks * head_dim, kv_heads * head_dim
    h, inter = c["hidden_size"], c["intermediate_size"] // ranks
    attention = {"qkv": (q + 2 * kv, h, "norm"), "o": (h, q, "none")}
    lm_head = {"lm_head": (c["vocab_size"] // ranks, h, "none")}
    if "num_experts" in c:  # the experts run in the MoE kernels (benchmarks/moe.py); the router is a GEMV
        return attention | {"router": (c["num_experts"], h, "none")} | lm_head
    if rows == 1:
        return attention | {"gate_up": (2 * inter, h, "norm"), "down": (h, inter, "activation")} | lm_head
    return attention | {"gate_up": (2 * inter, h, "norm+activation"), "down": (h, inter, "none")} | lm_head


def fp8_block(fp8: str | None, k: int) -> tuple[int, int] | None:
    """The block one scale covers for the `--fp8` setting and a weight of `k` inputs (None: bf16)."""
    return {None: None, "per-channel": (1, k), "128x128": (128, 128)}[fp8]


def products(k: int, prologue: str, act: str, fp8: str | None = None, rows: int = 1):
    """(our GEMV, torch then cuBLAS) for products of `rows` rows with a weight with `k` inputs, with
    `prologue` fused (the RMSNorm in front for "norm", the activation `act` in front for "activation", the
    norm in front and the activation behind for "norm+activation") on fixed inputs. With `fp8` our GEMV takes
    (FP8 weight, its scales per `fp8_block`) instead of the bf16 weight."""
    x = torch.randn(rows, 2 * k if prologue == "activation" else k, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5

    def scaled(gemv):
        if not fp8:
            return gemv
        return lambda w: gemv(w[0], weight_scale=w[1], weight_block=fp8_block(fp8, k))

    if prologue == "norm":
        return (
            scaled(lambda w, **scales: triton_gemv.rms_norm_gemv(x, residual, norm_weight, EPS, w, **scales)),
            lambda w: F.linear(rms_norm(x + residual, norm_weight, EPS), w),
        )
    if prologue == "norm+activation":
        return (
            scaled(
                lambda w, **scales: triton_gemv.rms_norm_gemv(
                    x, residual, norm_weight, EPS, w, hidden_act=act, **scales
                )[0]
            ),
            lambda w: gated_activation(F.linear(rms_norm(x + residual, norm_weight, EPS), w), act),
        )
    if prologue == "activation":
        return (
            scaled(lambda w, **scales: triton_gemv.gated_gemv(x, w, act, **scales)),
            lambda w: F.linear(gated_activation(x, act), w),
        )
    return scaled(lambda w, **scales: triton_gemv.gemv(x, w, **scales)), lambda w: F.linear(x, w)


def back_to_back_us(product, weights: list[torch.Tensor]) -> float:
    """Microseconds per call of `product(w)`, called on each of `weights` in turn in a CUDA graph."""
    return triton.testing.do_bench_cudagraph(lambda: [product(w) for w in weights], rep=50) * 1e3 / len(weights)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Copies of an [n, k] bf16 weight, 256 MB in all (at least 4), several times the L2 cache."""
    copies = max(4, (256 << 20) // (n * k * 2))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def chooser(rows: int) -> str:
    """The name of the function in triton_gemv that picks the tiles of a product of `rows` rows."""
    return "blocks_for" if rows == 1 else "rows_blocks_for"


def block_sizes(prologue: str, n: int, k: int, fp8: str | None, rows: int) -> str:
    """The GEMV's BLOCK_N, BLOCK_K and warps (and stages, for several rows) for a product of `rows` rows with
    an [n, k] weight with `prologue` in front."""
    if rows > 1:
        return ", ".join(map(str, triton_gemv.rows_blocks_for(n, 2, 128 if fp8 == "128x128" else None)))
    constant = {"norm": triton_gemv.RMS_NORM, "activation": triton_gemv.GATED}.get(prologue, triton_gemv.PLAIN)
    return ", ".join(map(str, triton_gemv.blocks_for(constant, n, k, fp8 is not None)))


def with_blocks(product, rows: int, blocks: tuple[int, ...]):
    """`product` of `rows` rows run with the GEMV's tiles set to `blocks` (whatever the prologue and shape)."""

    def run(weight) -> torch.Tensor:
        name = chooser(rows)
        chosen = getattr(triton_gemv, name)
        setattr(triton_gemv, name, lambda *_: blocks)
        try:
            return product(weight)
        finally:
            setattr(triton_gemv, name, chosen)

    return run


def sweep_choices(rows: int, fp8: str | None) -> list[tuple[int, ...]]:
    """The tiles a sweep times: (BLOCK_N, BLOCK_K, warps) for one row, (BLOCK_N, BLOCK_K, warps, stages) for
    several."""
    if rows == 1 and fp8:
        return list(triton_gemv.FP8_TILES)
    if rows == 1:
        return list(itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8)))
    return list(itertools.product((16, 32, 64), (128, 256, 512), (4,), (3, 4)))


def time_row(shape: str, name: str, n: int, k: int, prologue: str, rows: int, args) -> str:
    """One line of the table: a product of `rows` rows with the projection `name` ([n, k]) of `shape`."""
    weights = weight_copies(n, k)
    ours, reference = products(k, prologue, hidden_act(shape), args.fp8, rows)
    cublas = back_to_back_us(reference, weights)
    block = fp8_block(args.fp8, k)
    ours_weights = weights if block is None else [quantize_blocks(w, block) for w in weights]
    timed = back_to_back_us(ours, ours_weights)
    best = ""
    if args.sweep:
        fastest = min(
            (back_to_back_us(with_blocks(ours, rows, blocks), ours_weights), blocks)
            for blocks in sweep_choices(rows, args.fp8)
        )
        best = f"{', '.join(map(str, fastest[1]))} ({fastest[0]:.2f})"
    bytes_per_weight = 1 if args.fp8 else 2
    return (
        f"| {shape} | {name} | {prologue} | {rows} | {cublas:.2f} | {timed:.2f} | "
        f"{timed / cublas:.2f} | "
        f"{n * k * bytes_per_weight / timed / 1e6:.2f} | {block_sizes(prologue, n, k, args.fp8, rows)} | {best} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every BLOCK_N, BLOCK_K and warp count too")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=["0.6b", "8b"], help="model shapes")
    parser.add_argument(
        "--fp8",
        nargs="?",
        const="per-channel",
        choices=["per-channel", "128x128"],
        help="our GEMV on FP8 weights, with per-channel scales (the default) or 128 x 128 block scales",
    )
    parser.add_argument(
        "--rows", nargs="+", type=int, default=[1], help=f"rows of x, 1 to {triton_gemv.MAX_ROWS} (default 1)"
    )
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="time one rank's share of each product (default 1)"
    )
    args = parser.parse_args()
    bandwidth, source = hbm_bandwidth()
    weights_label = f"FP8 weights, {args.fp8} scales (cuBLAS: bf16)" if args.fp8 else "bf16"
    print(
        f"machine: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); {weights_label}; "
        f"products back to back in a CUDA graph, weights not in L2; one of {args.tensor_parallel_size} rank(s)"
    )
    print(
        "| shape | proj | fused | rows | torch + cuBLAS us | GEMV us | GEMV / cuBLAS | GEMV TB/s "
        "| BLOCK_N, BLOCK_K, warps | best (us) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for rows in args.rows:
            for name, (n, k, prologue) in projections(shape, rows, args.tensor_parallel_size).items():
                print(time_row(shape, name, n, k, prologue, rows, args), flush=True)


if __name__ == "__main__":
    main()
