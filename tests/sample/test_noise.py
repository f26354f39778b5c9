"""Hash noise: a function of (seed, position, token) only, distributed as Exp(1); the seed scheme."""

import numpy as np
import pytest
import torch

from nanovllm.sample.noise import (
    NOISE_KEY_RANGE,
    ROW_SEED_RANGE,
    device_row_seeds,
    draw_row_seeds,
    hash32,
    open_uniform,
    request_noise_key,
    seeded_exponential,
)


def test_hash_stays_in_32_bits_and_spreads_neighbours():
    x = torch.arange(1 << 16)
    h = hash32(x)
    assert int(h.min()) >= 0 and int(h.max()) < 1 << 32
    assert h.unique().numel() == x.numel()  # a bijection on 32 bits
    # each output bit is set about half the time over consecutive inputs
    bits = torch.stack([(h >> b) & 1 for b in range(32)]).float().mean(1)
    assert ((bits - 0.5).abs() < 0.01).all()


def test_noise_depends_only_on_seed_position_and_token():
    seeds, positions = torch.tensor([1, 2, 1, 1]), torch.tensor([10, 10, 11, 10])
    noise = seeded_exponential(seeds, positions, 64)
    assert torch.equal(noise[0], noise[3])
    assert torch.equal(noise[0], seeded_exponential(seeds[:1], positions[:1], 64)[0])
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])


def test_noise_is_exponential_and_uncorrelated():
    noise = seeded_exponential(torch.arange(200) * 31, torch.arange(200), 5000)
    assert noise.min() > 0 and noise.isfinite().all()
    for x in (0.1, 0.5, 1.0, 2.0, 4.0):
        assert abs(float((noise < x).float().mean()) - (1 - torch.exp(torch.tensor(-x)))) < 0.003
    centred = noise - 1
    # neighbouring tokens, neighbouring rows
    assert abs(float((centred[:, 1:] * centred[:, :-1]).mean())) < 0.01
    assert abs(float((centred[1:] * centred[:-1]).mean())) < 0.01


def test_uniforms_stay_inside_the_open_interval_at_the_extreme_hashes():
    # the largest hash once rounded to 1.0, whose noise -log(1) = 0 made p / 0 win every draw
    u = open_uniform(torch.tensor([0, 1, (1 << 32) - 2, (1 << 32) - 1]))
    assert (u > 0).all() and (u < 1).all()
    assert (-u.log() > 0).all()


def test_the_seed_scheme_keys_seeded_requests_in_int64_and_draws_row_seeds_below_their_range():
    assert request_noise_key(-3) == NOISE_KEY_RANGE - 3 and request_noise_key(1 << 64) == 0
    assert torch.tensor([request_noise_key(-1)]).dtype == torch.int64
    seeds = draw_row_seeds(np.random.default_rng(0), 1000)
    assert seeds.min() >= 0 and seeds.max() < ROW_SEED_RANGE
    # the decode buffers' generator, seeded with Config.seed, gives the same seeds run after run
    assert (draw_row_seeds(np.random.default_rng(0), 1000) == seeds).all()
    device_seeds = device_row_seeds(1000, torch.device("cpu"))
    assert device_seeds.dtype == torch.int64
    assert 0 <= int(device_seeds.min()) and int(device_seeds.max()) < ROW_SEED_RANGE


@pytest.mark.gpu
def test_seeded_noise_on_gpu_equals_cpu():
    seeds, positions = torch.arange(8) * 977, torch.arange(8) + 100
    cpu = seeded_exponential(seeds, positions, 151936)
    gpu = seeded_exponential(seeds.cuda(), positions.cuda(), 151936).cpu()
    assert torch.allclose(cpu, gpu, rtol=1e-6)
