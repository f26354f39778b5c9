"""One-sequence decode's matrix products: nanovllm's Triton GEMV beside cuBLAS (F.linear).

For each projection of a Qwen3-0.6B- and a Qwen3-8B-shaped decoder layer (qkv,
o, gate/up, down) and the LM head (bf16, one row), it prints the time of one product and the
HBM bandwidth that reading the weight once at that speed means, beside the
data-sheet peak. As in a decode step, products run back to back in a CUDA
graph, each on a different copy of the weight (copies of 256 MB in all, so
none is read from L2), and the time includes the gaps between them.
`--sweep` also times each BLOCK_N and BLOCK_K and prints the best per shape.

    python benchmarks/gemv.py [--sweep]
"""

import argparse

import torch
import torch.nn.functional as F
import triton
from throughput import SHAPES, VOCAB_SIZE, hbm_bandwidth

from nanovllm.kernels import triton_gemv


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(output features, input features) of each projection of one decoder layer, and of the LM head."""
    c = SHAPES[shape]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return {"qkv": (q + 2 * kv, c["hidden_size"]), "o": (c["hidden_size"], q),
            "gate_up": (2 * c["intermediate_size"], c["hidden_size"]), "down": (c["hidden_size"], c["intermediate_size"]),
            "lm_head": (VOCAB_SIZE, c["hidden_size"])}


def back_to_back_us(product, weights: list[torch.Tensor]) -> float:
    """Microseconds per call of `product(w)`, called on each of `weights` in turn in a CUDA graph."""
    return triton.testing.do_bench_cudagraph(lambda: [product(w) for w in weights], rep=50) * 1e3 / len(weights)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    """Copies of an [n, k] bf16 weight, 256 MB in all (at least 4), several times the L2 cache."""
    copies = max(4, (256 << 20) // (n * k * 2))
    return [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]


def gemv_with_blocks(x: torch.Tensor, block_n: int, block_k: int):
    def product(weight: torch.Tensor) -> torch.Tensor:
        triton_gemv.BLOCK_N, triton_gemv.BLOCK_K = block_n, block_k
        return triton_gemv.gemv(x, weight)
    return product


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every BLOCK_N and BLOCK_K too")
    args = parser.parse_args()
    bandwidth, source = hbm_bandwidth()
    print(f"machine: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); bf16, one row; "
          f"products back to back in a CUDA graph, weights not in L2")
    print("| shape | proj | cuBLAS us | GEMV us | GEMV / cuBLAS | GEMV TB/s | BLOCK_N, BLOCK_K | best (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for name, (n, k) in projections(shape).items():
            weights = weight_copies(n, k)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            cublas = back_to_back_us(lambda w: F.linear(x, w), weights)
            ours = back_to_back_us(lambda w: triton_gemv.gemv(x, w), weights)
            best = ""
            if args.sweep:
                default = triton_gemv.BLOCK_N, triton_gemv.BLOCK_K
                timed = min((back_to_back_us(gemv_with_blocks(x, block_n, block_k), weights), block_n, block_k)
                            for block_n in (1, 2, 4) for block_k in (1024, 2048, 4096))
                triton_gemv.BLOCK_N, triton_gemv.BLOCK_K = default
                best = f"{timed[1]}, {timed[2]} ({timed[0]:.2f})"
            print(f"| {shape} | {name} | {cublas:.2f} | {ours:.2f} | {ours / cublas:.2f} | "
                  f"{n * k * 2 / ours / 1e6:.2f} | {triton_gemv.BLOCK_N}, {triton_gemv.BLOCK_K} | {best} |")
            del weights


if __name__ == "__main__":
    main()
