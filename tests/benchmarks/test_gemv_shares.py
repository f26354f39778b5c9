"""benchmarks/gemv.py --tensor-parallel-size: the products it times are one rank's share of the model's."""

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def projections(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from gemv import projections

    return projections


def test_two_ranks_split_qkv_gate_up_and_head_by_outputs_and_o_down_by_inputs(projections):
    # Qwen3-8B: 32 query heads and 8 KV heads of 128, hidden 4096, MLP 12288, vocabulary 151,936
    assert projections("8b", 1, 2) == {
        "qkv": (16 * 128 + 2 * 4 * 128, 4096, "norm"),
        "o": (4096, 16 * 128, "none"),
        "gate_up": (12288, 4096, "norm"),
        "down": (4096, 6144, "activation"),
        "lm_head": (75968, 4096, "none"),
    }


def test_more_ranks_than_kv_heads_hold_one_kv_head_each(projections):
    qkv_n, _, _ = projections("8b", 1, 16)["qkv"]
    assert qkv_n == 2 * 128 + 2 * 128  # two query heads, one repeated KV head


def test_one_rank_times_the_whole_products(projections):
    assert projections("8b", 4) == projections("8b", 4, 1)
    assert projections("8b", 1)["gate_up"] == (2 * 12288, 4096, "norm")
