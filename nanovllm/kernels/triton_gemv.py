"""Triton kernel: y = W x for one row x, the matrix products of a one-sequence decode step, with
the element-wise step that makes x read inside the product.

Layout: W [N, K] contiguous (an nn.Linear weight); y [N], in x's dtype. Grid:
(cdiv(N, BLOCK_N),). A program owns BLOCK_N output features: it streams their
rows of W once, BLOCK_K columns at a time, multiplies them with x (which stays
in cache) and sums in fp32 on the CUDA cores. The product is bound by reading
W; many small programs keep enough loads in flight to read it faster than
cuBLAS's kernels do at one row. Each program issues its first chunk of W
before it waits for the kernel before it (programmatic dependent launch,
`triton_pdl.py`), and the next chunk while it multiplies the current one.
`benchmarks/gemv.py` times both back to back with cold caches; on an H100, no
other BLOCK_N (1, 2, 4) and BLOCK_K (1024 ... 4096) it tries was more than
10% faster on any Qwen3-0.6B or -8B projection or LM head.

What x is, by the constexpr PROLOGUE, each program computing it itself from
inputs that stay in cache (a launch costs more than the redundant arithmetic):
- PLAIN: x [K] as given.
- RMS_NORM: x = RMSNorm(a + r) with weight g, from a, r, g [K] (r optional);
  program 0 also writes a + r to h [K], the next residual. The arithmetic is
  `layers/layernorm.py`'s: the sum and the normalised values rounded to the
  dtype, the norm in fp32.
- SILU_MUL: x = SiLU(gate) * up, from gate_up [2K] = gate | up, rounded to the
  dtype like `layers/activation.py`'s.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

BLOCK_N = 2  # few features per program: even a 1024-feature output keeps 512 programs in flight
BLOCK_K = 1024
PLAIN, RMS_NORM, SILU_MUL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)  # PROLOGUE


@triton.jit
def _input_chunk(a_ptr, r_ptr, g_ptr, k, k_ok, K, rstd, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """x[k] for one chunk of columns, fp32 (see the module docstring)."""
    dtype = a_ptr.dtype.element_ty
    a = tl.load(a_ptr + k, mask=k_ok, other=0.0)
    if PROLOGUE == RMS_NORM:
        if HAS_RESIDUAL:
            a = (a.to(tl.float32) + tl.load(r_ptr + k, mask=k_ok, other=0.0).to(tl.float32)).to(dtype)
        g = tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        a = (g * (a.to(tl.float32) * rstd).to(dtype).to(tl.float32)).to(dtype)
    elif PROLOGUE == SILU_MUL:
        gate = a.to(tl.float32)
        up = tl.load(a_ptr + K + k, mask=k_ok, other=0.0).to(tl.float32)
        a = (gate / (1.0 + tl.exp(-gate)) * up).to(dtype)
    return a.to(tl.float32)


@triton.jit
def _weight_chunk(w_ptr, features, feature_ok, start, columns, K):
    """W[features, start:start + BLOCK_K], zero outside W: [BLOCK_N, BLOCK_K]."""
    k = start + columns
    return tl.load(w_ptr + features[:, None].to(tl.int64) * K + k[None, :],
                   mask=feature_ok[:, None] & (k < K)[None, :], other=0.0)


@triton.jit
def _gemv_kernel(a_ptr, r_ptr, g_ptr, w_ptr, y_ptr, h_ptr, N, K, eps, PROLOGUE: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    dtype = a_ptr.dtype.element_ty
    features = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    columns = tl.arange(0, BLOCK_K)
    feature_ok = features < N
    # the weights depend on no earlier kernel: the first chunk is read while that kernel finishes
    w = _weight_chunk(w_ptr, features, feature_ok, 0, columns, K)
    wait_for_previous_kernel(PDL)
    rstd = 1.0
    if PROLOGUE == RMS_NORM:
        # a first pass over the (cached) input for its mean square; program 0 writes the residual sum
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            k = start + columns
            k_ok = k < K
            h = tl.load(a_ptr + k, mask=k_ok, other=0.0)
            if HAS_RESIDUAL:
                h = (h.to(tl.float32) + tl.load(r_ptr + k, mask=k_ok, other=0.0).to(tl.float32)).to(dtype)
                if tl.program_id(0) == 0:
                    tl.store(h_ptr + k, h, mask=k_ok)
            squares += h.to(tl.float32) * h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + columns
        x = _input_chunk(a_ptr, r_ptr, g_ptr, k, k < K, K, rstd, PROLOGUE, HAS_RESIDUAL)
        # w: [BLOCK_N, BLOCK_K], this chunk, loaded one chunk ahead; x: [BLOCK_K]
        acc += w.to(tl.float32) * x[None, :]
        w = _weight_chunk(w_ptr, features, feature_ok, start + BLOCK_K, columns, K)
    tl.store(y_ptr + features, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=feature_ok)


def _launch(a: torch.Tensor, weight: torch.Tensor, prologue: tl.constexpr, residual: torch.Tensor | None = None,
            norm_weight: torch.Tensor | None = None, eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
    n, k = weight.shape
    assert a.size(0) == 1 and a.stride(1) == 1 and weight.is_contiguous()
    y = torch.empty(1, n, dtype=a.dtype, device=a.device)
    h = torch.empty(1, k, dtype=a.dtype, device=a.device) if residual is not None else None
    _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](
        a, residual if residual is not None else a, norm_weight if norm_weight is not None else a, weight, y,
        h if h is not None else y, n, k, eps, PROLOGUE=prologue.value, HAS_RESIDUAL=residual is not None,
        BLOCK_N=BLOCK_N, BLOCK_K=min(BLOCK_K, triton.next_power_of_2(k)), num_warps=4, **pdl_launch(a.device))
    return y, h


def gemv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T for a single row x."""
    # x: [1, K]; weight: [N, K] -> [1, N]
    assert x.shape == (1, weight.size(1))
    return _launch(x, weight, PLAIN)[0]


def rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm(x + residual) @ weight^T for a single row, and x + residual (x itself without a
    residual): a pre-norm block's norm and first projection in one launch."""
    # x, residual: [1, K]; norm_weight: [K]; weight: [N, K] -> [1, N], [1, K]
    assert x.shape == (1, weight.size(1)) and (residual is None or residual.is_contiguous())
    y, h = _launch(x, weight, RMS_NORM, residual, norm_weight, eps)
    return y, x if h is None else h


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(SiLU(gate) * up) @ weight^T for a single row gate_up = gate | up: an MLP's activation and
    down projection in one launch."""
    # gate_up: [1, 2K]; weight: [N, K] -> [1, N]
    assert gate_up.shape == (1, 2 * weight.size(1))
    return _launch(gate_up, weight, SILU_MUL)[0]
