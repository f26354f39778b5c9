"""Triton kernel: y = W x for one row x, the matrix products of a one-sequence decode step.

Layout: x [K] contiguous; W [N, K] contiguous (an nn.Linear weight); y [N], in
x's dtype. Grid: (cdiv(N, BLOCK_N),). A program owns BLOCK_N output features:
it streams their rows of W once, BLOCK_K columns at a time, multiplies them
with x (which stays in cache) and sums in fp32 on the CUDA cores. The product
is bound by reading W; many small programs keep enough loads in flight to
read it faster than cuBLAS's kernels do at one row (`benchmarks/gemv.py`
times both; on an H100, BLOCK_N = 2 was the best or within 10% of it on every
Qwen3-0.6B and -8B projection but the 8B o projection, 21% slower than with 4).
"""

import torch
import triton
import triton.language as tl

BLOCK_N = 2  # few features per program: even a 1024-feature output keeps 512 programs in flight
BLOCK_K = 1024


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    columns = tl.arange(0, BLOCK_K)
    feature_ok = features < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + columns
        k_ok = k < K
        # w: [BLOCK_N, BLOCK_K]; x: [BLOCK_K]
        w = tl.load(w_ptr + features[:, None].to(tl.int64) * K + k[None, :],
                    mask=feature_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + k, mask=k_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + features, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=feature_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T for a single row x."""
    # x: [1, K]; weight: [N, K] -> [1, N]
    n, k = weight.shape
    assert x.shape == (1, k) and x.stride(1) == 1 and weight.is_contiguous()
    y = torch.empty(1, n, dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](x, weight, y, n, k, BLOCK_N=BLOCK_N,
                                             BLOCK_K=min(BLOCK_K, triton.next_power_of_2(k)), num_warps=4)
    return y
