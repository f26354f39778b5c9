"""The gated delta rule in plain PyTorch, token by token: the Gated DeltaNet's recurrence (CPU path, reference).

Each value head keeps a state S [key_head_dim, value_head_dim]. At each token, with q and k L2-normalised
(q also scaled by key_head_dim ** -0.5), a decay g <= 0 and a write strength beta in (0, 1):

    S <- exp(g) * S                       forget
    S <- S + k (beta * (v - k^T S))^T     write v at k, correcting what S already holds there (the delta rule)
    o  = q^T S                            read

Value heads share key heads in groups: value head h reads key head h // (value heads / key heads).
"""

import torch


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dimension (FLA's and transformers' epsilon)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    step_states: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of B sequences of T tokens each from their initial `state`, and the state after the last
    token, all in fp32. A token with g = 0 and beta = 0 leaves the state as it was: the padding of a shorter
    sequence in the batch. `step_states`, where given, receives the state after each of the first S tokens
    (speculative decoding keeps the one after its last kept draft)."""
    # q, k: [B, T, key_heads, dk]; v: [B, T, heads, dv]; g, beta: [B, T, heads]; state: [B, heads, dk, dv];
    # step_states: [B, S, heads, dk, dv] fp32
    recorded = 0 if step_states is None else min(step_states.size(1), v.size(1))
    group = v.size(2) // k.size(2)
    q = l2_normalized(q.float()).repeat_interleave(group, dim=2) * q.size(-1) ** -0.5
    k = l2_normalized(k.float()).repeat_interleave(group, dim=2)
    v, decay, beta = v.float(), g.float().exp(), beta.float()
    state = state.float()
    out = torch.empty_like(v)  # [B, T, heads, dv]
    for t in range(v.size(1)):
        state = state * decay[:, t, :, None, None]
        held = torch.einsum("bhk,bhkv->bhv", k[:, t], state)  # what the state holds at k
        delta = (v[:, t] - held) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], state)
        if t < recorded:
            step_states[:, t] = state
    return out, state
