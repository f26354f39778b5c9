"""One-sequence decode's matrix products: nanovllm's Triton GEMV beside cuBLAS (F.linear).

For each projection of a decoder layer of each model shape asked for (Qwen3-0.6B
and Qwen3-8B by default) and its LM head (bf16, one row) it times the product as a decode step runs it, with the
step that makes its input fused in front (the norm before qkv and gate/up, the
activation before down), beside the same step in torch followed by cuBLAS. It
prints the HBM bandwidth that reading the weight once at that speed means,
beside the data-sheet peak. As in a decode step, products run back to back in
a CUDA graph, each on a different copy of the weight (copies of 256 MB in all,
so none is read from L2), and the time includes the gaps between them.
`--sweep` also times each BLOCK_N, BLOCK_K and warp count and prints the best per shape. `--fp8` times
the products with the weights in FP8 (per-channel scales, a byte per weight) instead, beside the same
torch + cuBLAS bf16 product.

    python benchmarks/gemv.py [--sweep] [--fp8] [--shapes 0.6b 8b gemma-2-9b ...]
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
from model_shapes import SHAPES
from throughput import hbm_bandwidth

from nanovllm.kernels import triton_gemv
from nanovllm.kernels.fp8_weights import quantize_rows
from nanovllm.layers.activation import gated_activation
from nanovllm.layers.layernorm import rms_norm

EPS = 1e-6


def hidden_act(shape: str) -> str:
    """The MLP's gated activation of `shape` (Gemma's configs name it hidden_activation)."""
    c = SHAPES[shape]
    return c.get("hidden_activation") or c["hidden_act"]


def projections(shape: str) -> dict[str, tuple[int, int, str]]:
    """(output features, input features, what is fused in front) of each projection of one decoder
    layer, and of the LM head."""
    c = SHAPES[shape]
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    h, inter = c["hidden_size"], c["intermediate_size"]
    attention = {"qkv": (q + 2 * kv, h, "norm"), "o": (h, q, "none")}
    lm_head = {"lm_head": (c["vocab_size"], h, "none")}
    if "num_experts" in c:  # the experts run in the MoE kernels (benchmarks/moe.py); the router is a GEMV
        return attention | {"router": (c["num_experts"], h, "none")} | lm_head
    return attention | {"gate_up": (2 * inter, h, "norm"), "down": (h, inter, "activation")} | lm_head


def products(k: int, prologue: str, act: str, fp8: bool = False):
    """(our GEMV, torch then cuBLAS) for one-row products of a weight with `k` inputs, with `prologue` in
    front (the RMSNorm for "norm", the activation `act` for "activation") on fixed inputs. With `fp8` our
    GEMV takes (FP8 weight, its per-channel scales) instead of the bf16 weight."""
    x = torch.randn(1, 2 * k if prologue == "activation" else k, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5

    def scaled(gemv):
        if not fp8:
            return gemv
        return lambda w: gemv(w[0], weight_scale=w[1], weight_block=(1, k))

    if prologue == "norm":
        return (
            scaled(lambda w, **scales: triton_gemv.rms_norm_gemv(x, residual, norm_weight, EPS, w, **scales)),
            lambda w: F.linear(rms_norm(x + residual, norm_weight, EPS), w),
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


def block_table(fp8: bool) -> str:
    """The name of the GEMV's table of block sizes for full-precision or FP8 weights."""
    return "FP8_BLOCKS" if fp8 else "BLOCKS"


def block_sizes(prologue: str, n: int, k: int, fp8: bool) -> str:
    """The GEMV's BLOCK_N, BLOCK_K and warps for an [n, k] product with `prologue` in front."""
    constant = {"norm": triton_gemv.RMS_NORM, "activation": triton_gemv.GATED}.get(prologue, triton_gemv.PLAIN)
    return ", ".join(map(str, triton_gemv.blocks_for(constant, n, k, fp8)))


def with_blocks(product, blocks: tuple[int, int, int], fp8: bool):
    """`product` run with the GEMV's BLOCK_N, BLOCK_K and warps set to `blocks` (for every prologue and shape)."""

    def run(weight) -> torch.Tensor:
        setattr(triton_gemv, block_table(fp8), dict.fromkeys(triton_gemv.BLOCKS, blocks))
        triton_gemv.SHAPE_BLOCKS = {}
        return product(weight)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every BLOCK_N, BLOCK_K and warp count too")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=["0.6b", "8b"], help="model shapes")
    parser.add_argument("--fp8", action="store_true", help="our GEMV on FP8 weights (per-channel scales)")
    args = parser.parse_args()
    bandwidth, source = hbm_bandwidth()
    weights_label = "FP8 weights (cuBLAS: bf16)" if args.fp8 else "bf16"
    print(
        f"machine: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); {weights_label}, "
        f"one row; products back to back in a CUDA graph, weights not in L2"
    )
    print(
        "| shape | proj | in front | torch + cuBLAS us | GEMV us | GEMV / cuBLAS | GEMV TB/s | BLOCK_N, BLOCK_K, warps "
        "| best (us) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        act = hidden_act(shape)
        for name, (n, k, prologue) in projections(shape).items():
            weights = weight_copies(n, k)
            ours, reference = products(k, prologue, act, args.fp8)
            cublas = back_to_back_us(reference, weights)
            ours_weights = [quantize_rows(w) for w in weights] if args.fp8 else weights
            timed = back_to_back_us(ours, ours_weights)
            best = ""
            if args.sweep:
                table = block_table(args.fp8)
                default, shape_default = getattr(triton_gemv, table), triton_gemv.SHAPE_BLOCKS
                columns = (1024, 2048, 4096) if args.fp8 else (512, 1024, 2048)
                fastest = min(
                    (back_to_back_us(with_blocks(ours, blocks, args.fp8), ours_weights), blocks)
                    for blocks in itertools.product((4, 8, 16), columns, (4, 8))
                )
                setattr(triton_gemv, table, default)
                triton_gemv.SHAPE_BLOCKS = shape_default
                best = f"{', '.join(map(str, fastest[1]))} ({fastest[0]:.2f})"
            bytes_per_weight = 1 if args.fp8 else 2
            print(
                f"| {shape} | {name} | {prologue} | {cublas:.2f} | {timed:.2f} | {timed / cublas:.2f} | "
                f"{n * k * bytes_per_weight / timed / 1e6:.2f} | {block_sizes(prologue, n, k, args.fp8)} | {best} |"
            )
            del weights, ours_weights


if __name__ == "__main__":
    main()
