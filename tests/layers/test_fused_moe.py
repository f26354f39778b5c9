"""The mixture-of-experts layer: routing and token grouping against a direct computation, the experts'
weighted sum against a token-by-token one, and each rank's slices of the experts, loaded alike from one
checkpoint tensor per expert and from stacked ones, summing to the whole layer's output."""

import math

import pytest
import torch
import torch.nn.functional as F

from nanovllm.layers.fused_moe import FusedMoE, moe_experts
from nanovllm.layers.moe_routing import group_by_expert, route
from nanovllm.utils.parallel import tensor_parallel

EXPERTS, TOP_K, HIDDEN, WIDTH = 8, 2, 16, 12


def direct_route(logits: list[float], top_k: int, renormalize: bool) -> tuple[list[float], list[int]]:
    """Softmax, the top_k experts, their probabilities (renormalised), in plain Python."""
    exps = [math.exp(v) for v in logits]
    probs = [v / sum(exps) for v in exps]
    ids = sorted(range(len(probs)), key=lambda e: -probs[e])[:top_k]
    chosen = [probs[e] for e in ids]
    return [p / sum(chosen) for p in chosen] if renormalize else chosen, ids


@pytest.mark.parametrize("renormalize", [False, True])
def test_route_picks_each_tokens_most_probable_experts_and_weighs_them_by_their_probability(renormalize):
    torch.manual_seed(0)
    logits = torch.randn(6, EXPERTS) * 2
    weights, ids = route(logits, TOP_K, renormalize)
    assert weights.shape == ids.shape == (6, TOP_K) and weights.dtype == torch.float32
    for t in range(6):
        want_weights, want_ids = direct_route(logits[t].tolist(), TOP_K, renormalize)
        assert ids[t].tolist() == want_ids
        assert weights[t].tolist() == pytest.approx(want_weights, rel=1e-5)


def test_a_shared_expert_joins_every_token_last_weighted_by_its_gates_sigmoid():
    torch.manual_seed(3)
    logits = torch.randn(4, EXPERTS + 1)  # the last column: the shared expert's gate
    weights, ids = route(logits, TOP_K, renormalize=True, shared_gate=True)
    routed_weights, routed_ids = route(logits[:, :EXPERTS], TOP_K, renormalize=True)
    assert ids.tolist() == [row + [EXPERTS] for row in routed_ids.tolist()]
    torch.testing.assert_close(weights[:, :TOP_K], routed_weights)
    torch.testing.assert_close(weights[:, TOP_K], logits[:, EXPERTS].sigmoid())


def test_renormalised_weights_are_the_softmax_of_the_chosen_logits_in_fp32():
    # Mixtral's formulation of the same weights; bfloat16 logits are routed in fp32
    torch.manual_seed(1)
    logits = torch.randn(5, EXPERTS).bfloat16()
    weights, ids = route(logits, TOP_K, renormalize=True)
    torch.testing.assert_close(weights, torch.softmax(logits.float().gather(1, ids), dim=-1))


def test_group_by_expert_lists_each_experts_slots_in_token_order():
    ids = torch.tensor([[3, 1], [1, 0], [3, 1]])  # slots 0..5: experts 3, 1, 1, 0, 3, 1
    order, counts = group_by_expert(ids, num_experts=5)
    assert order.tolist() == [3, 1, 2, 5, 0, 4]
    assert counts.tolist() == [1, 3, 0, 2, 0]


def random_experts(seed: int = 0) -> dict[str, torch.Tensor]:
    """Each expert's gate, up ([experts, width, hidden]) and down ([experts, hidden, width])."""
    torch.manual_seed(seed)
    shapes = {"gate": (EXPERTS, WIDTH, HIDDEN), "up": (EXPERTS, WIDTH, HIDDEN), "down": (EXPERTS, HIDDEN, WIDTH)}
    return {part: torch.randn(shape) / 4 for part, shape in shapes.items()}


def test_the_experts_weighted_sum_equals_a_token_by_token_computation():
    experts = random_experts()
    torch.manual_seed(2)
    x = torch.randn(7, HIDDEN)
    weights, ids = route(torch.randn(7, EXPERTS), TOP_K, renormalize=False)
    w13 = torch.cat([experts["gate"], experts["up"]], dim=1)
    got = moe_experts(x, w13, experts["down"], weights, ids, "silu")
    for t in range(7):
        want = sum(
            weight * (F.silu(experts["gate"][e] @ x[t]) * (experts["up"][e] @ x[t])) @ experts["down"][e].T
            for weight, e in zip(weights[t].tolist(), ids[t].tolist())
        )
        torch.testing.assert_close(got[t], want)


def test_no_tokens_give_an_empty_output():
    experts = random_experts()
    w13 = torch.cat([experts["gate"], experts["up"]], dim=1)
    out = moe_experts(
        torch.empty(0, HIDDEN), w13, experts["down"], torch.empty(0, TOP_K), torch.empty(0, TOP_K).long(), "silu"
    )
    assert out.shape == (0, HIDDEN)


def loaded_layer(experts: dict[str, torch.Tensor], stacked: bool, rank: int = 0, size: int = 1) -> FusedMoE:
    """Rank `rank` of `size` of a layer loaded from one tensor per expert, or from the stacked tensors."""
    with tensor_parallel(rank, size):
        layer = FusedMoE(EXPERTS, TOP_K, HIDDEN, WIDTH, "silu", renormalize=True)
    if stacked:
        layer.w13.weight_loader(layer.w13, torch.cat([experts["gate"], experts["up"]], dim=1))
        layer.w2.weight_loader(layer.w2, experts["down"])
        return layer
    for e in range(EXPERTS):
        for part in ("gate", "up"):
            layer.w13.weight_loader(layer.w13, experts[part][e], (e, part))
        layer.w2.weight_loader(layer.w2, experts["down"][e], (e, "down"))
    return layer


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_holds_the_same_slice_of_every_experts_width_from_either_layout(rank):
    experts = random_experts()
    rows = slice(rank * WIDTH // 2, (rank + 1) * WIDTH // 2)
    for stacked in (False, True):
        layer = loaded_layer(experts, stacked, rank, 2)
        assert torch.equal(layer.w13, torch.cat([experts["gate"][:, rows], experts["up"][:, rows]], dim=1))
        assert torch.equal(layer.w2, experts["down"][:, :, rows])


def test_the_ranks_partial_outputs_sum_to_the_whole_layers():
    # what the all-reduce adds up: each rank's experts over its slice of their width
    experts = random_experts()
    torch.manual_seed(3)
    x, logits = torch.randn(9, HIDDEN), torch.randn(9, EXPERTS)
    whole = loaded_layer(experts, stacked=True)(x, logits)
    weights, ids = route(logits, TOP_K, renormalize=True)
    parts = [loaded_layer(experts, stacked=False, rank=r, size=2) for r in (0, 1)]
    summed = sum(moe_experts(x, part.w13, part.w2, weights, ids, "silu") for part in parts)
    torch.testing.assert_close(summed, whole)
