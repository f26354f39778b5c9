"""A mixture-of-experts layer alone: the fused Triton experts of a Qwen3-30B-A3B-shaped layer (128 experts,
top-8, hidden 2048, expert width 768, bf16), routing included, on a GPU; `--shape gpt-oss-20b` times
gpt-oss-20b's (32 experts, top-4, hidden and width 2880, biased, clamped SwiGLU) in bf16, and
`--shape gpt-oss-20b-mxfp4` the same experts in MXFP4 as the checkpoint ships them (4.25 bits a weight).

- Prefill (16,384 tokens): TFLOP/s beside one dense GEMM of the same FLOPs ([16,384 x 2,048] times
  [2,048 x 18,432]: each token's 8 experts' gate, up and down) in the same run.
- Decode-sized batches (1 to 256 tokens): time beside the memory roofline of reading the experts the
  batch selects (9.4 MB each) once, at the data sheet's HBM bandwidth.

Each time is of the layer replayed in a CUDA graph, as the engine runs it. `--sweep` also times every
tile setting per token count and prints the fastest, the rows of `kernels/triton_moe.TILES`.

    python benchmarks/moe.py [--shape gpt-oss-20b-mxfp4] [--sweep]
"""

import argparse
import itertools
from dataclasses import dataclass

import torch
import triton.testing
from throughput import hbm_bandwidth

from nanovllm.kernels import mxfp4, triton_moe
from nanovllm.kernels.triton_moe_routing import route_experts


@dataclass(frozen=True)
class Experts:
    """A layer's experts: how many, how many each token picks, their sizes, activation and format."""

    experts: int
    top_k: int
    hidden: int
    width: int
    act: str = "silu"
    biased: bool = False
    mxfp4: bool = False

    def bytes_per_expert(self) -> float:
        """Gate, up and down as stored: bf16, or MXFP4's half byte a weight and a byte per 32."""
        weights = 3 * self.width * self.hidden
        return weights * (17 / 32 if self.mxfp4 else 2)


SHAPES = {
    "qwen3-30b-a3b": Experts(128, 8, 2048, 768),
    "gpt-oss-20b": Experts(32, 4, 2880, 2880, "gpt_oss_swiglu", biased=True),
    "gpt-oss-20b-mxfp4": Experts(32, 4, 2880, 2880, "gpt_oss_swiglu", biased=True, mxfp4=True),
}
DTYPE = torch.bfloat16
DECODE_TOKENS = [1, 8, 64, 256]
PREFILL_TOKENS = 16384


def layer(shape: Experts, num_tokens: int, seed: int = 0):
    """The layer's inputs for `num_tokens` tokens, routed by random logits, and a function that runs it."""
    torch.manual_seed(seed)
    e, hidden, width = shape.experts, shape.hidden, shape.width
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=DTYPE)
    w13 = torch.randn(e, 2 * width, hidden, device="cuda", dtype=DTYPE) / hidden**0.5
    w2 = torch.randn(e, hidden, width, device="cuda", dtype=DTYPE) / width**0.5
    extras = {}
    if shape.biased:
        extras.update(w13_bias=torch.randn(e, 2 * width, device="cuda", dtype=DTYPE) * 0.1)
        extras.update(w2_bias=torch.randn(e, hidden, device="cuda", dtype=DTYPE) * 0.1)
    if shape.mxfp4:
        (w13, extras["w13_scale"]), (w2, extras["w2_scale"]) = mxfp4.quantize(w13), mxfp4.quantize(w2)
    logits = torch.randn(num_tokens, e, device="cuda")

    def run() -> torch.Tensor:
        weights, ids = route_experts(logits, shape.top_k, renormalize=True)
        return triton_moe.fused_experts(x, w13, w2, weights, ids, shape.act, **extras)

    selected = route_experts(logits, shape.top_k, renormalize=True)[1].unique().numel()
    return run, selected


def graph_ms(fn) -> float:
    """Milliseconds per call of `fn` replayed in a CUDA graph."""
    fn()
    return triton.testing.do_bench_cudagraph(fn, rep=100)


def flops(shape: Experts, num_tokens: int) -> float:
    """Each token's top-k experts: gate and up (2 x width x hidden) and down (hidden x width), 2 FLOPs a term."""
    return 2.0 * num_tokens * shape.top_k * 3 * shape.width * shape.hidden


def dense_gemm_ms(shape: Experts) -> float:
    """One GEMM of the prefill's FLOPs, [tokens, hidden] x [hidden, top_k * 3 * width], through cuBLAS."""
    a = torch.randn(PREFILL_TOKENS, shape.hidden, device="cuda", dtype=DTYPE)
    b = torch.randn(shape.hidden, shape.top_k * 3 * shape.width, device="cuda", dtype=DTYPE)
    return graph_ms(lambda: a @ b)


def sweep(shape: Experts, num_tokens: int) -> tuple[float, tuple]:
    """The fastest tile setting for `num_tokens` tokens and its time, set in the table the shape's format
    reads (`triton_moe.TILES`, or `MXFP4_TILES`)."""
    run, _ = layer(shape, num_tokens)
    table = "MXFP4_TILES" if shape.mxfp4 else "TILES"
    default, results = getattr(triton_moe, table), []
    for tiles in itertools.product((16, 32, 64, 128), (32, 64, 128), (64, 128), (4, 8), (3,)):
        setattr(triton_moe, table, {1: tiles})
        try:
            results.append((graph_ms(run), tiles))
        except triton.runtime.errors.OutOfResources:
            continue
    setattr(triton_moe, table, default)
    return min(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b", help="the layer's experts")
    parser.add_argument("--sweep", action="store_true", help="time every tile setting per token count")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    bandwidth, source = hbm_bandwidth()
    expert_bytes = shape.bytes_per_expert()
    print(
        f"machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, HBM {bandwidth / 1e12:.2f} TB/s "
        f"({source}); {args.shape}: {shape.experts} experts, top-{shape.top_k}, hidden {shape.hidden}, width "
        f"{shape.width}, {'MXFP4' if shape.mxfp4 else 'bf16'} weights, bf16 activations, in a CUDA graph"
    )
    run, _ = layer(shape, PREFILL_TOKENS)
    moe_ms, dense_ms = graph_ms(run), dense_gemm_ms(shape)
    prefill_flops = flops(shape, PREFILL_TOKENS)
    moe_tflops, dense_tflops = prefill_flops / moe_ms / 1e9, prefill_flops / dense_ms / 1e9
    print(
        f"prefill {PREFILL_TOKENS:,} tokens: {moe_ms * 1e3:,.0f} us, {moe_tflops:,.0f} TFLOP/s; one dense GEMM of "
        f"the same FLOPs {dense_ms * 1e3:,.0f} us, {dense_tflops:,.0f} TFLOP/s; {moe_tflops / dense_tflops:.0%} of it"
    )
    for num_tokens in DECODE_TOKENS:
        run, selected = layer(shape, num_tokens)
        ms = graph_ms(run)
        roofline_us = selected * expert_bytes / bandwidth * 1e6
        print(
            f"{num_tokens:4d} tokens: {ms * 1e3:7.1f} us; {selected} experts selected, read once at HBM peak "
            f"{roofline_us:6.1f} us; {ms * 1e3 / roofline_us:.2f}x"
        )
    if args.sweep:
        for num_tokens in (16, 64, 256, 1024, 2048, PREFILL_TOKENS):
            ms, tiles = sweep(shape, num_tokens)
            print(f"  fastest for {num_tokens} tokens: {tiles} (BLOCK_M, N, K, warps, stages), {ms * 1e3:.1f} us")


if __name__ == "__main__":
    main()
