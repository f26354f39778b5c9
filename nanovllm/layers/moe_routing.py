"""Mixture-of-experts routing: which experts each token runs through, with what weights, and the token
slots grouped by expert. Both stay on the device; the plain-PyTorch experts (`fused_moe`) and a
grouped-GEMM kernel read the same output."""

import torch


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, shared_gate: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k experts of each token by softmax probability (computed in fp32), and their weights: those
    probabilities, renormalised to sum to 1 when `renormalize` (Mixtral; Qwen3-MoE's norm_topk_prob). With
    `shared_gate`, the last logit is a shared expert's gate rather than a routed expert's: the shared expert
    (the last id) joins every token's choices last, weighted by the gate's sigmoid.

    logits: [tokens, experts (+ 1)] -> weights [tokens, top_k (+ 1)] fp32, ids [tokens, top_k (+ 1)] int64
    (most probable first)
    """
    routed = logits[:, :-1] if shared_gate else logits
    probs = torch.softmax(routed, dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if shared_gate:
        weights = torch.cat([weights, logits[:, -1:].float().sigmoid()], dim=-1)
        ids = torch.cat([ids, torch.full_like(ids[:, :1], routed.size(1))], dim=-1)
    return weights, ids


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The token slots (token t's j-th choice is slot t * top_k + j) in the order of their experts, and how
    many each expert got: expert e's slots are order[sum(counts[:e]) : sum(counts[:e + 1])], in token order.

    ids: [tokens, top_k] -> order [tokens * top_k] int64, counts [num_experts] int64
    """
    slots = ids.flatten()
    # stable: within an expert, tokens keep their order
    return slots.argsort(stable=True), torch.bincount(slots, minlength=num_experts)
