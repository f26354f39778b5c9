"""Triton kernel: an MLP's gated activation, act(gate) * up, over the rows of gate_up = gate | up.

Layout: gate_up [rows, 2I] (rows may be strided, each row's values
contiguous); out [rows, I], contiguous. Grid: (rows, cdiv(I, BLOCK)): a
program reads BLOCK values of one row's gate and the same of its up, and
writes their product. The activation is SiLU or GELU's tanh approximation
(GeGLU), computed in fp32 and rounded to the dtype once, as torch.compile's
kernel of `act(gate) * up` rounds it; or gpt-oss's clamped SwiGLU, (up + 1) *
gate * sigmoid(1.702 gate) with gate clamped at 7 and up to [-7, 7]
(`layers/activation.py` has its reference).

A kernel of its own, because torch.compile's for this step (dynamic shapes)
indexes each value through a division by I and reads well short of the
memory's bandwidth. `gated` is also the prologue of the one-row GEMV
(`triton_gemv.py`), which reads the activation inside the down projection.
"""

import torch
import triton
import triton.language as tl

SILU, GELU_TANH, GPT_OSS_SWIGLU = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
ACTIVATIONS = {"silu": SILU, "gelu_pytorch_tanh": GELU_TANH, "gpt_oss_swiglu": GPT_OSS_SWIGLU}  # hidden_act -> ACT
_GPT_OSS_LIMIT, _GPT_OSS_ALPHA = tl.constexpr(7.0), tl.constexpr(1.702)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_BLOCK = 1024


@triton.jit
def gated(gate, up, ACT: tl.constexpr):
    """act(gate) * up in fp32, from gate and up of any float dtype (gpt-oss's: its clamped SwiGLU)."""
    g = gate.to(tl.float32)
    if ACT == GPT_OSS_SWIGLU:
        g = tl.minimum(g, _GPT_OSS_LIMIT)
        u = tl.minimum(tl.maximum(up.to(tl.float32), -_GPT_OSS_LIMIT), _GPT_OSS_LIMIT)
        return (u + 1.0) * g / (1.0 + tl.exp(-_GPT_OSS_ALPHA * g))
    if ACT == SILU:
        activated = g / (1.0 + tl.exp(-g))
    else:  # 0.5 g (1 + tanh(y)) = g (1 - 1 / (exp(2y) + 1)), which stays finite at either end
        y = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        activated = g * (1.0 - 1.0 / (tl.exp(2.0 * y) + 1.0))
    return activated * up.to(tl.float32)


@triton.jit
def _gated_kernel(x_ptr, out_ptr, I, stride_x, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = columns < I
    gate = tl.load(x_ptr + row * stride_x + columns, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + I + columns, mask=mask, other=0.0)
    tl.store(out_ptr + row * I + columns, gated(gate, up, ACT).to(out_ptr.dtype.element_ty), mask=mask)


def gated_activation(gate_up: torch.Tensor, hidden_act: str) -> torch.Tensor:
    """act(gate) * up for gate_up = gate | up, act being `hidden_act` (a key of ACTIVATIONS)."""
    # gate_up: [rows, 2I] -> [rows, I]
    rows, width = gate_up.shape
    assert gate_up.stride(1) == 1 and width % 2 == 0
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        grid = (rows, triton.cdiv(width // 2, _BLOCK))
        _gated_kernel[grid](gate_up, out, width // 2, gate_up.stride(0), ACT=ACTIVATIONS[hidden_act], BLOCK=_BLOCK)
    return out
