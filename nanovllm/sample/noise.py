"""Sampling noise and the seeds it comes from: the one seed scheme.

Every drawing row (temperature > 0) takes the argmax of its probabilities over
Exp(1) noise (Gumbel-max). Where the noise comes from:

- A request with a seed: from `seeded_exponential`, a counter-based hash of
  (its noise key, the position of the token drawn, the token id), so that it
  draws the same noise at the same position whatever else is in the batch,
  after a preemption too; a whole batch of seeded rows takes one set of tensor
  ops. Its noise key is `request_noise_key(seed)`: the seed mod 2^63, a
  non-negative int64. A request of n completions (or best_of) gives completion i
  the seed seed + i, wrapped within int64 (`completion_seed`, in the front end).
- A row without a seed, in a step of greedy and plain temperature rows only
  (`sample_with_temperatures`, in a decode graph or eagerly): on CUDA from the
  Triton kernel's Philox generator, keyed by a per-row seed drawn afresh every
  step in [0, ROW_SEED_RANGE): by the decode buffers' host generator
  (`draw_row_seeds`, itself seeded with `Config.seed`), so that a replayed
  graph draws new noise without a kernel to make it, or else by the device's
  generator (`device_row_seeds`); on the CPU from torch's `exponential_`.
- A row without a seed in the full sampler: torch's `exponential_` on the
  device's generator.
"""

from functools import lru_cache

import numpy as np
import torch

NOISE_KEY_RANGE = 1 << 63  # a seeded request's noise key is its seed mod this: a non-negative int64
ROW_SEED_RANGE = 1 << 62  # the per-row Philox seeds of unseeded rows are drawn from [0, ROW_SEED_RANGE)

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1


def request_noise_key(seed: int) -> int:
    """The key of a seeded request's noise (`seeded_exponential`'s `seeds`): its seed as an int64 >= 0."""
    return seed % NOISE_KEY_RANGE


def draw_row_seeds(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Fresh Philox seeds [rows] for unseeded rows, from a host generator."""
    return rng.integers(0, ROW_SEED_RANGE, rows)


def device_row_seeds(rows: int, device: torch.device) -> torch.Tensor:
    """Fresh Philox seeds [rows] int64 for unseeded rows, from the device's generator."""
    return torch.randint(0, ROW_SEED_RANGE, (rows,), device=device)


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
    """Exp(1) noise [rows, vocab] for noise keys [rows] (`request_noise_key`, int64 >= 0) drawing the token
    at positions [rows]: a function of (key, position, token id) only."""
    row_keys = hash32(hash32(hash32(positions & _MASK32) ^ (seeds >> 32)) ^ (seeds & _MASK32))
    bits = hash32(row_keys.unsqueeze(1) ^ _token_keys(vocab_size, seeds.device).unsqueeze(0))
    return open_uniform(bits).log_().neg_()
