"""Rotary position embedding (rotate-half layout) from a precomputed cos/sin table."""

import math

import torch
from torch import nn

from nanovllm.layers.layernorm import RMSNorm, rms_norm


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # Llama 3.1's long-context rule: keep high frequencies, divide low ones by
    # `factor`, and blend smoothly in between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    is_medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(is_medium, blended, scaled)


def _yarn_inv_freq(inv_freq: torch.Tensor, rotary_dim: int, params: dict) -> torch.Tensor:
    # YaRN: frequencies that turn many times within the original context keep their value
    # (extrapolation), those that turn less than once are divided by `factor` (interpolation), and a
    # linear ramp over the dimensions in between blends the two.
    base, factor = params["rope_theta"], params["factor"]
    old_len = params["original_max_position_embeddings"]
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def dimension(rotations: float) -> float:  # the dimension that turns `rotations` times in old_len
        return rotary_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(fast), dimension(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    high = high + 0.001 if high == low else high
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp)


def _proportional_inv_freq(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Gemma 4's "proportional" rotary: every dimension pair of the head (j, j + head_dim / 2) keeps the
    frequency a full rotation gives it, but only the first partial_rotary_factor of the pairs turn; the
    others get frequency 0 (they pass through), and all are divided by `factor`. Unlike a partial rotary
    over the first dimensions, the turning pairs span the whole head."""
    head_dim = 2 * inv_freq.numel()
    turning = int(params["partial_rotary_factor"] * head_dim // 2)  # transformers' rounding
    inv_freq = inv_freq.clone()
    inv_freq[turning:] = 0.0
    return inv_freq / params.get("factor", 1.0)


def _yarn_attention_factor(params: dict) -> float:
    """YaRN's scale on cos and sin, which sharpens attention at long range: 0.1 ln(factor) + 1 unless given."""
    if params.get("attention_factor") is not None:
        return params["attention_factor"]

    def mscale(scale: float) -> float:
        return 1.0 if params["factor"] <= 1 else 0.1 * scale * math.log(params["factor"]) + 1.0

    if params.get("mscale") and params.get("mscale_all_dim"):
        return mscale(params["mscale"]) / mscale(params["mscale_all_dim"])
    return mscale(1.0)


def _longrope_attention_factor(params: dict) -> float:
    """LongRoPE's scale on cos and sin: sqrt(1 + ln(factor) / ln(original context)) unless given, 1 for a
    factor of at most 1."""
    if params.get("attention_factor") is not None:
        return params["attention_factor"]
    factor, old_len = params["factor"], params["original_max_position_embeddings"]
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))


def _longrope_angles(positions: torch.Tensor, powers: torch.Tensor, params: dict) -> torch.Tensor:
    """LongRoPE's angles [positions, rotary_dim / 2] (`powers`: rope_theta ** (2i / rotary_dim)): positions
    inside the original context turn at the frequencies of `short_factor`, those past it at those of
    `long_factor`.

    transformers rotates a whole sequence with one of the lists: the short one
    while it fits in original_max_position_embeddings, the long one once it
    does not (Phi-3's generate drops its cache on the first token past it and
    encodes the whole sequence again). A paged cache keeps each key as it was
    rotated when stored, and a token must get the same key whether it came in
    one prefill, in chunks or from the prefix cache; so the list is chosen per
    position, as vLLM does. A sequence within the original context is rotated
    exactly as in transformers; past it, the new positions are too, but the
    keys before the boundary keep their short-factor rotation.
    """
    old_len = params["original_max_position_embeddings"]
    short = 1.0 / (torch.tensor(params["short_factor"], dtype=torch.float32) * powers)
    long = 1.0 / (torch.tensor(params["long_factor"], dtype=torch.float32) * powers)
    return torch.cat((torch.outer(positions[:old_len], short), torch.outer(positions[old_len:], long)))


def _angles_and_scale(positions: torch.Tensor, rotary_dim: int, params: dict) -> tuple[torch.Tensor, float]:
    """The rotation angles [positions, rotary_dim / 2] of each scaling type, and its scale on cos and sin."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    powers = params["rope_theta"] ** exponents  # 1 / the unscaled inverse frequencies
    if params["rope_type"] == "longrope":
        return _longrope_angles(positions, powers, params), _longrope_attention_factor(params)
    inv_freq = 1.0 / powers
    scale = 1.0
    if params["rope_type"] == "linear":
        inv_freq = inv_freq / params["factor"]  # positions divided by the factor
    elif params["rope_type"] == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    elif params["rope_type"] == "yarn":
        inv_freq, scale = _yarn_inv_freq(inv_freq, rotary_dim, params), _yarn_attention_factor(params)
    elif params["rope_type"] == "proportional":
        inv_freq = _proportional_inv_freq(inv_freq, params)
    return torch.outer(positions, inv_freq), scale


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k at given positions.

    Rotate-half (neox) layout over the first `rotary_dim` dimensions of each
    head (Phi-4-mini's partial_rotary_factor turns 96 of 128); the dimensions
    after them pass through unchanged.
    """

    def __init__(self, head_dim: int, max_position: int, params: dict, rotary_dim: int | None = None):
        """`params`: ModelConfig.rope_parameters (rope_type 'default', 'linear', 'llama3', 'yarn', 'longrope' or
        'proportional', rope_theta, the type's scaling keys); `rotary_dim`: ModelConfig.rotary_dim, every
        dimension if None."""
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        assert rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim
        freqs, scale = _angles_and_scale(torch.arange(max_position, dtype=torch.float), rotary_dim, params)
        angles = torch.cat((freqs, freqs), dim=-1)
        # cos_sin: [max_position, 2, rotary_dim], fp32; cast at use like the reference does
        cos_sin = torch.stack((angles.cos() * scale, angles.sin() * scale), dim=1)
        self.register_buffer("cos_sin", cos_sin, persistent=False)

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        q_norm: RMSNorm | None = None,
        k_norm: RMSNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k at `positions`; with q_norm/k_norm (Qwen3) each head is RMS-normalised first.
        On CUDA it is one Triton launch (the attention layer launches the same kernel with its cache, to
        store K/V in the same pass)."""
        # positions: [tokens]; q: [tokens, heads, head_dim]; k: [tokens, kv_heads, head_dim]
        weights = qk_norm_weights(q_norm, k_norm)
        if q.is_cuda:
            from nanovllm.kernels.triton_norm_rotary_store import norm_rotate_store  # Triton is needed on CUDA only

            return norm_rotate_store(positions, q, k, self.cos_sin, *weights)
        return norm_rotate_qk_reference(positions, q, k, self.cos_sin, *weights)


def qk_norm_weights(
    q_norm: RMSNorm | None, k_norm: RMSNorm | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
    """The rotary kernel's norm arguments: q and k norm weights and epsilon, or (None, None, 0.0) for none."""
    return (None, None, 0.0) if q_norm is None else (q_norm.weight, k_norm.weight, q_norm.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim] with its first cos.size(-1) dimensions rotated, the others as they are."""
    rotary_dim = cos.size(-1)
    x1, x2 = x[..., :rotary_dim].chunk(2, dim=-1)
    rotated = x[..., :rotary_dim] * cos + torch.cat((-x2, x1), dim=-1) * sin
    return rotated if rotary_dim == x.size(-1) else torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def norm_rotate_qk_reference(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain-PyTorch q/k norm and rotation: the CPU path and the Triton kernel's reference."""
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    cos_sin = cos_sin[positions].to(q.dtype)
    cos, sin = cos_sin[:, 0].unsqueeze(1), cos_sin[:, 1].unsqueeze(1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
