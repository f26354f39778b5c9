"""One-sequence decode's matrix products: nanovllm's Triton GEMV beside cuBLAS (F.linear).

For each projection of a decoder layer of each model shape asked for (Qwen3-0.6B
and Qwen3-8B by default) and its LM head (bf16, one row) it times the product as a decode step runs it, with the
step that makes its input fused in front (the norm before qkv and gate/up, the
activation before down), beside the same step in torch followed by cuBLAS. It
prints the HBM bandwidth that reading the weight once at that speed means,
beside the data-sheet peak. As in a decode step, products run back to back in
a CUDA graph, each on a different copy of the weight (copies of 256 MB in all,
so none is read from L2), and the time includes the gaps between them.
`--sweep` also times each BLOCK_N, BLOCK_K and warp count and prints the best per shape.

    python benchmarks/gemv.py [--sweep] [--shapes 0.6b 8b gemma-2-9b ...]
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
from model_shapes import SHAPES
from throughput import hbm_bandwidth

from nanovllm.kernels import triton_gemv
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


def products(k: int, prologue: str, act: str):
    """(ours, torch + cuBLAS): functions of a weight that run the product with its prologue (the gated
    activation `act` for "activation") on fixed inputs."""
    x = torch.randn(1, 2 * k if prologue == "activation" else k, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    norm_weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    if prologue == "norm":
        return (
            lambda w: triton_gemv.rms_norm_gemv(x, residual, norm_weight, EPS, w),
            lambda w: F.linear(rms_norm(x + residual, norm_weight, EPS), w),
        )
    if prologue == "activation":
        return lambda w: triton_gemv.gated_gemv(x, w, act), lambda w: F.linear(gated_activation(x, act), w)
    return lambda w: triton_gemv.gemv(x, w), lambda w: F.linear(x, w)


def back_to_back_us(product, weights: list[torch.Tensor]) -> float:
    """Microseconds per call of `product(w)`, called on each of `weights` in turn in a CUDA graph."""
    return triton.testing.do_bench_cudagraph(lambda: [product(w) for w in weights], rep=50) * 1e3 / len(weights)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Copies of an [n, k] bf16 weight, 256 MB in all (at least 4), several times the L2 cache."""
    copies = max(4, (256 << 20) // (n * k * 2))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def block_sizes(prologue: str) -> str:
    """The GEMV's BLOCK_N, BLOCK_K and warps for products with `prologue` in front."""
    constant = {"norm": triton_gemv.RMS_NORM, "activation": triton_gemv.GATED}.get(prologue, triton_gemv.PLAIN)
    return ", ".join(map(str, triton_gemv.BLOCKS[constant.value]))


def with_blocks(product, blocks: tuple[int, int, int]):
    """`product` run with the GEMV's BLOCK_N, BLOCK_K and warps set to `blocks` (for every prologue)."""

    def run(weight: torch.Tensor) -> torch.Tensor:
        triton_gemv.BLOCKS = dict.fromkeys(triton_gemv.BLOCKS, blocks)
        return product(weight)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every BLOCK_N, BLOCK_K and warp count too")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=["0.6b", "8b"], help="model shapes")
    args = parser.parse_args()
    bandwidth, source = hbm_bandwidth()
    print(
        f"machine: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); bf16, one row; "
        f"products back to back in a CUDA graph, weights not in L2"
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
            ours, reference = products(k, prologue, act)
            cublas = back_to_back_us(reference, weights)
            timed = back_to_back_us(ours, weights)
            best = ""
            if args.sweep:
                default = triton_gemv.BLOCKS
                fastest = min(
                    (back_to_back_us(with_blocks(ours, blocks), weights), blocks)
                    for blocks in itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8))
                )
                triton_gemv.BLOCKS = default
                best = f"{', '.join(map(str, fastest[1]))} ({fastest[0]:.2f})"
            print(
                f"| {shape} | {name} | {prologue} | {cublas:.2f} | {timed:.2f} | {timed / cublas:.2f} | "
                f"{n * k * 2 / timed / 1e6:.2f} | {block_sizes(prologue)} | {best} |"
            )
            del weights


if __name__ == "__main__":
    main()
