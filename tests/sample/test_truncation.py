"""min-p, top-k and top-p masks equal transformers' warpers, row by row."""

import pytest
import torch
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from nanovllm.sample.truncation import apply_min_p, apply_top_k_top_p

VOCAB = 200


@pytest.fixture
def logits():
    torch.manual_seed(0)
    return torch.randn(4, VOCAB) * 2


def per_row(logits, warper, values):
    ids = torch.zeros(1, 1, dtype=torch.long)  # the warpers ignore the ids
    return torch.cat([warper(v)(ids, logits[i : i + 1].clone()) for i, v in enumerate(values)])


def test_top_k_equals_transformers(logits):
    values = [1, 5, 50, VOCAB]
    mine = apply_top_k_top_p(logits, torch.tensor(values), None)
    assert torch.equal(mine, per_row(logits, lambda k: TopKLogitsWarper(top_k=k), values))


def test_top_p_equals_transformers(logits):
    values = [0.05, 0.5, 0.9, 1.0]
    mine = apply_top_k_top_p(logits, None, torch.tensor(values))
    assert torch.equal(mine, per_row(logits, lambda p: TopPLogitsWarper(top_p=p), values))


def test_top_k_then_top_p_equals_transformers_in_that_order(logits):
    ks, ps = [3, 20, VOCAB, 8], [0.5, 0.8, 0.3, 1.0]
    mine = apply_top_k_top_p(logits, torch.tensor(ks), torch.tensor(ps))
    theirs = per_row(per_row(logits, lambda k: TopKLogitsWarper(top_k=k), ks), lambda p: TopPLogitsWarper(top_p=p), ps)
    assert torch.equal(mine, theirs)


def test_min_p_equals_transformers(logits):
    values = [0.0, 0.05, 0.3, 1.0]
    mine = apply_min_p(logits, torch.tensor(values))
    theirs = torch.cat([logits[:1], per_row(logits[1:], lambda p: MinPLogitsWarper(min_p=p), values[1:])])
    assert torch.equal(mine, theirs)
