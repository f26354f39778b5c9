"""One-sequence decode's matrix products: nanovllm's Triton GEMV beside cuBLAS (F.linear).

For each projection of a Qwen3-0.6B- and a Qwen3-8B-shaped decoder layer (qkv,
o, gate/up, down; bf16, one row), it prints the time of one product replayed
in a CUDA graph (as decode steps run) and the HBM bandwidth that reading the
weight once at that speed means, beside the data-sheet peak. `--sweep` also
times each BLOCK_N and prints the best per shape.

    python benchmarks/gemv.py [--sweep]
"""

import argparse

import torch
import torch.nn.functional as F
import triton
from throughput import SHAPES, hbm_bandwidth

from nanovllm.kernels.triton_gemv import BLOCK_K, BLOCK_N, _gemv_kernel, gemv


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(output features, input features) of each projection of one decoder layer."""
    c = SHAPES[shape]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    return {"qkv": (q + 2 * kv, c["hidden_size"]), "o": (c["hidden_size"], q),
            "gate_up": (2 * c["intermediate_size"], c["hidden_size"]), "down": (c["hidden_size"], c["intermediate_size"])}


def graph_us(fn) -> float:
    """Microseconds of one call of `fn`, replayed in a CUDA graph."""
    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def gemv_with(x: torch.Tensor, weight: torch.Tensor, block_n: int):
    y = torch.empty(1, weight.size(0), dtype=x.dtype, device=x.device)
    n, k = weight.shape
    return lambda: _gemv_kernel[(triton.cdiv(n, block_n),)](x, weight, y, n, k, BLOCK_N=block_n,
                                                            BLOCK_K=min(BLOCK_K, triton.next_power_of_2(k)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time every BLOCK_N too")
    args = parser.parse_args()
    bandwidth, source = hbm_bandwidth()
    print(f"machine: {torch.cuda.get_device_name()}, HBM {bandwidth / 1e12:.2f} TB/s ({source}); bf16, one row; "
          f"one product replayed in a CUDA graph")
    print("| shape | proj | cuBLAS us | GEMV us | GEMV / cuBLAS | GEMV TB/s | BLOCK_N | best BLOCK_N (us) |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        for name, (n, k) in projections(shape).items():
            weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            cublas = graph_us(lambda: F.linear(x, weight))
            ours = graph_us(lambda: gemv(x, weight))
            best = ""
            if args.sweep:
                timed = min((graph_us(gemv_with(x, weight, block_n)), block_n) for block_n in (1, 2, 4, 8, 16))
                best = f"{timed[1]} ({timed[0]:.2f})"
            print(f"| {shape} | {name} | {cublas:.2f} | {ours:.2f} | {ours / cublas:.2f} | "
                  f"{weight.numel() * 2 / ours / 1e6:.2f} | {BLOCK_N} | {best} |")


if __name__ == "__main__":
    main()
