"""Triton kernel: a mixture-of-experts router's choices, each token's in one program.

Layout: logits [tokens, experts] (rows may be strided); weights [tokens,
top_k] fp32 and ids [tokens, top_k] int64, contiguous. Grid: (tokens,). A
program takes the softmax of its token's logits in fp32, picks the top_k
most probable experts one at a time (the lowest index among equals), and
renormalises their probabilities to sum to 1 when asked: what
`layers/moe_routing.route` computes in PyTorch in seven launches (softmax,
top-k's sort and gather, the sum, the division, the copies). With
SHARED_GATE the row's last logit is a shared expert's gate: the program
appends that expert (id num_experts) to the choices, weighted by the gate's
sigmoid, so the experts' kernels run it as one more choice.

Launched with programmatic dependent launch (`triton_pdl.py`): it reads
nothing before the router's product is done, but lets the experts' kernel
after it be placed early.
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel

# the most experts whose row one warp routes (8 logits a thread at 256)
ONE_WARP_EXPERTS = 256


@triton.jit
def _route_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    stride_lt,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SHARED_GATE: tl.constexpr,
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
    CHOICES: tl.constexpr = TOP_K + SHARED_GATE
    if SHARED_GATE:
        gate = tl.load(logits_ptr + token * stride_lt + num_experts).to(tl.float32)
        weights = tl.where(choices == TOP_K, tl.sigmoid(gate), weights)
        ids = tl.where(choices == TOP_K, num_experts, ids)
    out = token * CHOICES + choices
    tl.store(weights_ptr + out, weights, mask=choices < CHOICES)
    tl.store(ids_ptr + out, ids, mask=choices < CHOICES)


def route_experts(
    logits: torch.Tensor, top_k: int, renormalize: bool, shared_gate: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """What `layers/moe_routing.route` returns, in one launch.

    logits: [tokens, experts (+ 1)] -> weights [tokens, top_k (+ 1)] fp32, ids [tokens, top_k (+ 1)] int64
    (most probable first)
    """
    num_tokens, num_experts = logits.size(0), logits.size(1) - shared_gate
    choices = top_k + shared_gate
    assert logits.stride(1) == 1 and top_k <= num_experts
    weights = torch.empty(num_tokens, choices, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, choices, dtype=torch.int64, device=logits.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](
            logits,
            weights,
            ids,
            num_experts,
            logits.stride(0),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            SHARED_GATE=shared_gate,
            BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_J=triton.next_power_of_2(choices),
            # one warp reduces with shuffles alone: each pick's two reductions then need no barrier
            num_warps=1 if num_experts <= ONE_WARP_EXPERTS else 4,
            **pdl_launch(logits.device),
        )
    return weights, ids
