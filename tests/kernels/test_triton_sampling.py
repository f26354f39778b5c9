"""The Triton Gumbel-max sampler: greedy rows exact, draws distributed as softmax(logits / T)
(on the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch

from helpers.chi_square import chi_square_p_value

pytest.importorskip("triton")
from nanovllm.kernels.triton_sampling import gumbel_max_keys, gumbel_max_sample, ids_of_keys  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs there, so the GPU suite (`scripts/gpu_test.sh`, marker `gpu`) takes them all
pytestmark = pytest.mark.gpu if DEVICE == "cuda" else []
# the interpreter runs one program per row slowly: fewer draws, over a small vocabulary, on the CPU
DRAWS = 40000 if DEVICE == "cuda" else 600
TEMPERATURES = [0.5, 1.5] if DEVICE == "cuda" else [1.0]


def seed(value: int, rows: int) -> torch.Tensor:
    """Per-row seeds, the same value in every row (rows still draw apart: the noise counts rows too)."""
    return torch.full((rows,), value, device=DEVICE)


def test_zero_temperature_rows_take_the_argmax_across_chunks():
    torch.manual_seed(0)
    logits = torch.randn(3, 9000, device=DEVICE)  # three 4096-wide chunks
    logits[1, 8500] = 10.0
    temperatures = torch.tensor([0.0, 0.0, 0.0], device=DEVICE)
    assert torch.equal(gumbel_max_sample(logits, temperatures, seed(1, 3)), logits.argmax(-1))


def test_ties_across_chunks_go_to_the_lowest_index_and_the_ids_land_in_out():
    logits = torch.zeros(2, 9000, device=DEVICE)
    logits[:, [8200, 100, 5000]] = 3.0  # equal maxima in the third, first and second chunk
    out = torch.full((2,), -1, dtype=torch.int64, device=DEVICE)
    ids = gumbel_max_sample(logits, torch.zeros(2, device=DEVICE), seed(1, 2), out)
    assert ids is out and out.tolist() == [100, 100]


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.slow
def test_draws_follow_softmax_of_scaled_logits(temperature):
    torch.manual_seed(0)
    logits = torch.randn(6)
    temperatures = torch.full((DRAWS,), temperature, device=DEVICE)
    ids = gumbel_max_sample(logits.to(DEVICE).repeat(DRAWS, 1), temperatures, seed(3, DRAWS)).cpu()
    assert chi_square_p_value(ids, torch.softmax(logits / temperature, -1)) > 1e-3


@pytest.mark.slow
def test_different_seeds_draw_differently_and_same_seed_repeats():
    logits = torch.zeros(64, 100, device=DEVICE)
    temperatures = torch.ones(64, device=DEVICE)
    a, b = gumbel_max_sample(logits, temperatures, seed(5, 64)), gumbel_max_sample(logits, temperatures, seed(6, 64))
    assert torch.equal(a, gumbel_max_sample(logits, temperatures, seed(5, 64))) and not torch.equal(a, b)


def test_rows_of_nan_logits_still_give_token_ids_inside_the_vocabulary():
    # 9000 = two full chunks and a partial one whose tail is masked: a NaN row
    # must not pick a masked position past the vocabulary
    logits = torch.full((2, 9000), float("nan"), device=DEVICE)
    logits[1, :8900] = 0.0
    for temperatures in (torch.zeros(2, device=DEVICE), torch.ones(2, device=DEVICE)):
        ids = gumbel_max_sample(logits, temperatures, seed(7, 2))
        assert ((ids >= 0) & (ids < 9000)).all(), ids
        assert ids[1] >= 8900  # NaN counts as the largest value, as in torch.argmax


def draw_over_slices(logits, temperatures, seeds, bounds):
    """The draw the ranks make together when each holds the token ids between two of `bounds`: the
    largest of their keys (the all-reduce MAX), read back as a token id."""
    vocab = logits.size(1)
    keys = [
        gumbel_max_keys(logits[:, start:end].contiguous(), temperatures, seeds, start, vocab)
        for start, end in zip(bounds, bounds[1:])
    ]
    best = torch.stack(keys).max(dim=0).values
    return ids_of_keys(best, torch.empty_like(best))


@pytest.mark.parametrize("bounds", [[0, 4500, 9000], [0, 3001, 6002, 9000]])
def test_the_best_key_over_vocabulary_slices_is_the_draw_of_the_whole_row(bounds):
    # slices that start inside a chunk and at no multiple of four: the noise is the whole row's
    torch.manual_seed(0)
    logits = torch.randn(4, 9000, device=DEVICE) * 3
    logits[3, 5000] = float("nan")
    temperatures = torch.tensor([0.0, 0.7, 1.3, 1.0], device=DEVICE)
    for value in (11, 12, 13):
        seeds = seed(value, 4)
        whole = gumbel_max_sample(logits, temperatures, seeds)
        assert torch.equal(draw_over_slices(logits, temperatures, seeds, bounds), whole)
    assert whole[3] == 5000  # NaN ranks highest on any rank, as in torch.argmax


def test_equal_best_scores_on_two_slices_go_to_the_lower_token_id():
    logits = torch.zeros(2, 9000, device=DEVICE)
    logits[1] = -5.0  # negative scores order too
    logits[0, [8200, 100]] = 3.0
    logits[1, [8200, 100]] = -3.0
    ids = draw_over_slices(logits, torch.zeros(2, device=DEVICE), seed(1, 2), [0, 4500, 9000])
    assert ids.tolist() == [100, 100]
