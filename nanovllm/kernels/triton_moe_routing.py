"""Triton kernel: a mixture-of-experts router's choices, each token's in one program.

Layout: logits [tokens, experts] (rows may be strided); weights [tokens,
top_k] fp32 and ids [tokens, top_k] int64, contiguous. Grid: (tokens,). A
program takes the softmax of its token's logits in fp32, picks the top_k
most probable experts one at a time (the lowest index among equals), and
renormalises their probabilities to sum to 1 when asked: what
`layers/moe_routing.route` computes in PyTorch in seven launches (softmax,
top-k's sort and gather, the sum, the division, the copies).

Launched with programmatic dependent launch (`triton_pdl.py`): it reads
nothing before the router's product is done, but lets the experts' kernel
after it be placed early.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel


@triton.jit
def _route_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    stride_lt,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_J: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    expert_ok = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_lt + experts, mask=expert_ok, other=-float("inf"))
    logits = logits.to(tl.float32)
    probs = tl.exp(logits - tl.max(logits, axis=0))
    probs = probs / tl.sum(probs, axis=0)
    probs = tl.where(expert_ok, probs, -1.0)  # past the last expert: never chosen
    choices = tl.arange(0, BLOCK_J)
    weights = tl.zeros((BLOCK_J,), dtype=tl.float32)
    ids = tl.zeros((BLOCK_J,), dtype=tl.int64)
    for choice in tl.static_range(TOP_K):
        best = tl.max(probs, axis=0)
        best_id = tl.min(tl.where(probs == best, experts, BLOCK_E), axis=0)
        weights = tl.where(choices == choice, best, weights)
        ids = tl.where(choices == choice, best_id, ids)
        probs = tl.where(experts == best_id, -1.0, probs)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)  # the unused choices past TOP_K hold 0
    out = token * TOP_K + choices
    tl.store(weights_ptr + out, weights, mask=choices < TOP_K)
    tl.store(ids_ptr + out, ids, mask=choices < TOP_K)


def route_experts(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What `layers/moe_routing.route` returns, in one launch.

    logits: [tokens, experts] -> weights [tokens, top_k] fp32, ids [tokens, top_k] int64 (most probable first)
    """
    num_tokens, num_experts = logits.shape
    assert logits.stride(1) == 1 and top_k <= num_experts
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=logits.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](
            logits,
            weights,
            ids,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_J=triton.next_power_of_2(top_k),
            num_warps=1 if num_experts <= 128 else 4,
            **pdl_launch(logits.device),
        )
    return weights, ids
