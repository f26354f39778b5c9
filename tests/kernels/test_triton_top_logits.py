"""The largest logits of each row without a sort: truncation thresholds that keep the same sets as the
sort-based reference (`sample.truncation`), draws among them distributed as the truncated softmax, and the
top-k logprobs equal to a log-softmax's (on the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch

from helpers.chi_square import chi_square_p_value

pytest.importorskip("triton")
from nanovllm.kernels.triton_sampling import gumbel_max_sample  # noqa: E402
from nanovllm.kernels.triton_top_logits import top_logprobs, truncation_thresholds  # noqa: E402
from nanovllm.sample.truncation import apply_min_p, apply_top_k_top_p  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
VOCAB = 2500  # three chunks of 1024, the last one partial
# (temperature, top_k, top_p, min_p) per row; top_k VOCAB and top_p 1 are off
ROWS = [
    (1.0, 20, 1.0, 0.0),
    (0.7, VOCAB, 0.9, 0.0),
    (1.3, VOCAB, 1.0, 0.05),
    (0.6, 20, 0.95, 0.0),
    (1.0, 200, 0.5, 0.1),
    (1.0, 1, 0.9, 0.0),
    (1.0, VOCAB, 1.0, 0.0),
    (0.0, 5, 0.5, 0.2),
    (0.8, 40, 0.95, 0.3),  # min-p keeps fewer than top-k
]


def settings(rows):
    temperature, top_k, top_p, min_p = zip(*rows)
    return (
        torch.tensor(temperature, device=DEVICE),
        torch.tensor(top_k, dtype=torch.int64, device=DEVICE),
        torch.tensor(top_p, device=DEVICE),
        torch.tensor(min_p, device=DEVICE),
    )


def reference_kept(logits: torch.Tensor, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """What the sort-based sampler keeps: min-p, then top-k and top-p on the scaled logits."""
    scaled = logits.float() / torch.where(temperature == 0, 1.0, temperature).unsqueeze(1)
    scaled = apply_min_p(scaled, min_p)
    kept = torch.isfinite(apply_top_k_top_p(scaled, top_k, top_p))
    return torch.where((temperature == 0).unsqueeze(1), True, kept)


def distinct_logits(rows: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Logits of `dtype` with no two equal in a row (a tie at the threshold may be cut differently)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bfloat16:  # every bf16 of magnitude 2^-7 to 16, either sign: 2,816 values
        magnitudes = torch.arange(0x3C00, 0x4180, dtype=torch.int16).view(torch.bfloat16)
        values = torch.cat([magnitudes, -magnitudes])
    else:
        values = torch.randn(4 * VOCAB, generator=generator) * 3
    orders = [torch.randperm(values.numel(), generator=generator)[:VOCAB] for _ in range(rows)]
    return torch.stack([values[order] for order in orders]).to(dtype).to(DEVICE)


# a buffer of 16 candidates settles almost no row: the rest are searched by the fallback's bisection
@pytest.mark.parametrize("candidates", [pytest.param(1024, marks=pytest.mark.slow), 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thresholds_keep_what_the_sort_based_sampler_keeps(dtype, candidates):
    logits = distinct_logits(len(ROWS), dtype)
    temperature, top_k, top_p, min_p = settings(ROWS)
    thresholds = truncation_thresholds(logits, temperature, top_k, top_p, min_p, candidates)
    kept = logits.float() >= thresholds.unsqueeze(1)
    expected = reference_kept(logits, temperature, top_k, top_p, min_p)
    assert kept.sum(1).tolist() == expected.sum(1).tolist()
    assert torch.equal(kept, expected)
    assert kept[0].sum() == 20 and kept[5].sum() == 1 and kept[6].all() and thresholds[7] == float("-inf")


@pytest.mark.slow
def test_tied_logits_at_the_threshold_are_all_kept():
    logits = torch.zeros(1, VOCAB, device=DEVICE)
    logits[0, :30] = 2.0  # 30 tokens tie for the top; top-k 20 keeps all of them
    temperature, top_k, top_p, min_p = settings([(1.0, 20, 1.0, 0.0)])
    thresholds = truncation_thresholds(logits, temperature, top_k, top_p, min_p)
    assert thresholds.tolist() == [2.0]


@pytest.mark.slow
def test_draws_follow_the_truncated_softmax():
    draws = 600 if DEVICE == "cpu" else 40000
    logits = distinct_logits(1, torch.float32, seed=1)[:, :40].contiguous()
    temperature, top_k, top_p, min_p = settings([(0.8, 12, 0.8, 0.02)])
    thresholds = truncation_thresholds(logits, temperature, top_k, top_p, min_p)
    kept = reference_kept(logits, temperature, top_k, top_p, min_p)[0]
    assert 1 < int(kept.sum()) < 12
    probs = torch.softmax((logits[0] / 0.8).masked_fill(~kept, float("-inf")), -1)
    seeds = torch.arange(draws, device=DEVICE)
    ids = gumbel_max_sample(
        logits.expand(draws, -1).contiguous(),
        temperature.expand(draws).contiguous(),
        seeds,
        thresholds=thresholds.expand(draws).contiguous(),
    ).cpu()
    assert kept.cpu()[ids].all()
    assert chi_square_p_value(ids, probs.cpu()) > 1e-3


@pytest.mark.slow
def test_a_full_size_vocabulary_settles_top_p_and_min_p_alone_from_the_candidates():
    # 40,000 logits make 320 runs, more than the 256 whose maximum bounds a row without top-k
    generator = torch.Generator().manual_seed(2)
    rows = [(0.7, 40000, 0.9, 0.0), (1.0, 40000, 1.0, 0.1), (0.6, 20, 0.95, 0.0), (1.0, 40000, 0.5, 0.02)]
    temperature, top_k, top_p, min_p = settings(rows)
    logits = (torch.randn(len(rows), 40000, generator=generator) * 4).to(DEVICE)
    thresholds = truncation_thresholds(logits, temperature, top_k, top_p, min_p)
    kept = logits >= thresholds.unsqueeze(1)
    assert torch.equal(kept, reference_kept(logits, temperature, top_k, top_p, min_p))
    assert 1 < kept[0].sum() < 256 and 1 < kept[1].sum() < 256


@pytest.mark.parametrize("candidates", [pytest.param(1024, marks=pytest.mark.slow), 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_logprobs_are_the_log_softmax_top_k(dtype, candidates):
    logits = distinct_logits(3, dtype)
    reference = torch.log_softmax(logits.float(), -1)
    # the most likely token, one of middling rank, the least likely
    chosen = torch.stack([reference[0].argmax(), reference[1].argsort()[VOCAB // 2], reference[2].argmin()])
    for k in (1, 5, 20):
        ids, logprobs, log_sum_exp, ranks = top_logprobs(logits, chosen, k, candidates)
        assert torch.equal(ids, reference.topk(k).indices)
        assert torch.allclose(logprobs, reference.gather(1, ids), atol=1e-5)
        assert torch.allclose(log_sum_exp, torch.logsumexp(logits.float(), -1), atol=1e-5)
        assert ranks.tolist() == [1, VOCAB - VOCAB // 2, VOCAB]


def test_top_logprobs_of_tied_logits_past_the_buffer_still_come_out_exact():
    logits = torch.zeros(2, VOCAB, device=DEVICE)
    logits[1, 7] = 1.0
    chosen = torch.tensor([5, 9], device=DEVICE)
    # every logit ties: the buffer overflows
    ids, logprobs, _, ranks = top_logprobs(logits, chosen, 3, candidates=16)
    assert ids.tolist() == [[VOCAB - 1, VOCAB - 2, VOCAB - 3], [7, VOCAB - 1, VOCAB - 2]]
    assert ranks.tolist() == [1, 2]  # tied logits are not above the chosen one
    expected = -torch.log(torch.tensor(float(VOCAB)))
    assert torch.allclose(logprobs[0], expected.expand(3).to(DEVICE), atol=1e-5)
