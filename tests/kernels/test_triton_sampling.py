"""The Triton Gumbel-max sampler: greedy rows exact, draws distributed as softmax(logits / T)
(on the CPU under the Triton interpreter, which conftest selects)."""

import pytest
import torch

from helpers.chi_square import chi_square_p_value

pytest.importorskip("triton")
from nanovllm.kernels.triton_sampling import gumbel_max_sample  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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
