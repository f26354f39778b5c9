"""The Gumbel-max sampler: greedy rows take the argmax, sampled rows follow softmax(logits / T)."""

import torch

from nanovllm.layers.sampler import Sampler


def test_zero_temperature_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    ids = Sampler()(logits, torch.zeros(6))
    assert torch.equal(ids, logits.argmax(-1))


def test_mixed_batch_keeps_greedy_rows_greedy():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    temperatures = torch.tensor([0.0, 1.0, 0.0, 1.0])
    for _ in range(20):
        ids = Sampler()(logits, temperatures)
        assert ids[0] == logits[0].argmax() and ids[2] == logits[2].argmax()


def test_frequencies_follow_softmax_of_scaled_logits():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    draws = 40000
    temperature = 0.7
    ids = Sampler()(logits.repeat(draws, 1), torch.full((draws,), temperature))
    freq = torch.bincount(ids, minlength=4).float() / draws
    expected = torch.softmax(logits / temperature, dim=-1)
    # 4 standard errors of a binomial proportion
    tolerance = 4 * (expected * (1 - expected) / draws).sqrt()
    assert ((freq - expected).abs() <= tolerance).all(), (freq, expected)


def test_high_temperature_flattens_the_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([3.0, 0.0])
    draws = 4000
    cold = Sampler()(logits.repeat(draws, 1), torch.full((draws,), 0.5)).float().mean()
    hot = Sampler()(logits.repeat(draws, 1), torch.full((draws,), 5.0)).float().mean()
    assert cold < 0.01 and hot > 0.3


def test_no_temperatures_means_all_greedy():
    torch.manual_seed(0)
    logits = torch.randn(5, 50, dtype=torch.bfloat16)
    assert torch.equal(Sampler()(logits), logits.float().argmax(-1))
