"""Grammar masks applied to logits: the same logits as xgrammar's own apply_token_bitmask_inplace, on the
CPU (PyTorch) and on CUDA (the Triton kernel)."""

import pytest
import torch

from nanovllm.sample.bitmask import apply_bitmask_

xgrammar = pytest.importorskip("xgrammar")
DEVICES = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def random_bitmask(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """[rows, ceil(vocab / 32)] int32 with random bits, a few rows allowing one token only."""
    generator = torch.Generator().manual_seed(seed)
    words = torch.randint(-(1 << 31), 1 << 31, (rows, (vocab + 31) // 32), dtype=torch.int64, generator=generator)
    words[1] = 0
    words[1, 3] = 1 << 31  # only token 3 * 32 + 31: the sign bit of its word
    return words.to(torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# logits as wide as the mask (past one kernel block), and wider than the mask
@pytest.mark.parametrize("vocab", [4100, 5000])
@pytest.mark.filterwarnings("ignore:The bitmask covers only")  # xgrammar's note on the wider logits
def test_masks_forbid_what_xgrammar_forbids(device, dtype, vocab):
    torch.manual_seed(0)
    logits = torch.randn(5, vocab, dtype=dtype)
    bitmask = random_bitmask(5, 4100, seed=vocab)
    rows = [0, 1, 3]
    expected = logits.clone()
    xgrammar.apply_token_bitmask_inplace(expected, bitmask, indices=rows)
    ours = logits.to(device)
    apply_bitmask_(ours, bitmask.to(device), torch.tensor(rows, dtype=torch.int32, device=device))
    assert torch.equal(ours.cpu(), expected)
    assert torch.isfinite(ours[1]).sum() == 1 + (vocab - 4128 if vocab > 4128 else 0)
    assert torch.equal(ours[[2, 4]].cpu(), logits[[2, 4]])  # rows without a mask are untouched
