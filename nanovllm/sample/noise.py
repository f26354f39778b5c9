"""Exp(1) noise that depends only on (seed, position, token id).

A counter-based hash instead of a random generator: a seeded request draws the
same noise at the same position whatever else is in the batch, after a
preemption too, and a whole batch of seeded rows takes one set of tensor ops.
"""

from functools import lru_cache

import torch

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2^32).

    Both multipliers are below 2^31, so no product leaves the int64 range.
    """
    x = x ^ (x >> 16)
    # in place from here: the work is over [rows, vocab] elements
    x.mul_(0x21F0AAAD).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(0x735A2D97).bitwise_and_(_MASK32)
    return x.bitwise_xor_(x >> 15)


@lru_cache(maxsize=4)
def _token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    return hash32(torch.arange(vocab_size, device=device) * _GOLDEN & _MASK32)


def open_uniform(bits: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in (0, 1) from 32-bit hashes: the top 23 bits plus a half, scaled. With 24 bits
    the largest value would round to 1.0, giving Exp(1) noise 0, which a draw divides by."""
    return (bits >> 9).float().add_(0.5).mul_(2.0**-23)


def seeded_exponential(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [rows, vocab] for seeds [rows] (int64, >= 0) drawing the token at positions [rows]."""
    row_keys = hash32(hash32(hash32(positions & _MASK32) ^ (seeds >> 32)) ^ (seeds & _MASK32))
    bits = hash32(row_keys.unsqueeze(1) ^ _token_keys(vocab_size, seeds.device).unsqueeze(0))
    return open_uniform(bits).log_().neg_()
