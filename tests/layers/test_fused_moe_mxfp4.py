"""The experts held in MXFP4, loaded from gpt-oss's stacked blocks and scales: the layer's output is that of
the full-precision layer loaded with the same weights dequantized (so its gate and up rows are read in the
same order), each rank holds whole blocks of its slice, and what cannot split into whole blocks is refused."""

import pytest
import torch

from nanovllm.kernels.mxfp4 import dequantize, quantize
from nanovllm.layers.fused_moe import FusedMoE, moe_experts
from nanovllm.layers.moe_routing import route
from nanovllm.utils.parallel import tensor_parallel

EXPERTS, TOP_K, HIDDEN, WIDTH = 6, 2, 64, 64


def checkpoint_experts(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random gpt-oss experts as its MXFP4 checkpoints store them: gate_up blocks [experts, 2 * I, hidden / 32,
    16] (gate and up rows interleaved) and scales, down blocks [experts, hidden, I / 32, 16] and scales, biases."""
    torch.manual_seed(seed)
    gate_up, gate_up_scales = quantize(torch.randn(EXPERTS, 2 * WIDTH, HIDDEN) / 8)
    down, down_scales = quantize(torch.randn(EXPERTS, HIDDEN, WIDTH) / 8)
    return {
        "gate_up_proj_blocks": gate_up.unflatten(-1, (-1, 16)),
        "gate_up_proj_scales": gate_up_scales,
        "down_proj_blocks": down.unflatten(-1, (-1, 16)),
        "down_proj_scales": down_scales,
        "gate_up_proj_bias": torch.randn(EXPERTS, 2 * WIDTH),
        "down_proj_bias": torch.randn(EXPERTS, HIDDEN),
    }


def layer(mxfp4: bool, rank: int = 0, size: int = 1) -> FusedMoE:
    with tensor_parallel(rank, size):
        return FusedMoE(
            EXPERTS, TOP_K, HIDDEN, WIDTH, "gpt_oss_swiglu", True, bias=True, inputs_first=True, mxfp4=mxfp4
        )


def mxfp4_layer(tensors: dict, rank: int = 0, size: int = 1) -> FusedMoE:
    """Rank `rank` of `size` of the MXFP4 layer, loaded from the checkpoint's tensors."""
    moe = layer(True, rank, size)
    names = {"w13": "gate_up_proj_blocks", "w13_scale": "gate_up_proj_scales", "w2": "down_proj_blocks"}
    names |= {"w2_scale": "down_proj_scales", "w13_bias": "gate_up_proj_bias", "w2_bias": "down_proj_bias"}
    for name, param in moe.named_parameters():
        param.weight_loader(param, tensors[names[name]])
    return moe


def dequantized_layer(tensors: dict) -> FusedMoE:
    """The full-precision layer loaded with the checkpoint's experts dequantized, inputs first as gpt-oss's bf16
    checkpoints hold them."""
    moe = layer(False)
    gate_up = dequantize(tensors["gate_up_proj_blocks"].flatten(2), tensors["gate_up_proj_scales"], torch.float32)
    down = dequantize(tensors["down_proj_blocks"].flatten(2), tensors["down_proj_scales"], torch.float32)
    moe.w13.weight_loader(moe.w13, gate_up.transpose(1, 2))
    moe.w2.weight_loader(moe.w2, down.transpose(1, 2))
    moe.w13_bias.weight_loader(moe.w13_bias, tensors["gate_up_proj_bias"])
    moe.w2_bias.weight_loader(moe.w2_bias, tensors["down_proj_bias"])
    return moe


def test_the_mxfp4_layer_computes_what_the_dequantized_one_does():
    tensors = checkpoint_experts()
    torch.manual_seed(1)
    x, logits = torch.randn(9, HIDDEN), torch.randn(9, EXPERTS)
    got = mxfp4_layer(tensors)(x, logits)
    torch.testing.assert_close(got, dequantized_layer(tensors)(x, logits), rtol=1e-5, atol=1e-5)


def test_the_ranks_partial_outputs_sum_to_the_whole_layers():
    tensors = checkpoint_experts()
    torch.manual_seed(2)
    x, logits = torch.randn(5, HIDDEN), torch.randn(5, EXPERTS)
    parts = [mxfp4_layer(tensors, rank, 2) for rank in (0, 1)]
    assert parts[0].w13.shape == (EXPERTS, WIDTH, HIDDEN // 2) and parts[0].w2_scale.shape == (EXPERTS, HIDDEN, 1)
    # what the all-reduce adds up; the down bias joins on rank 0 alone
    weights, ids = route(logits, TOP_K, renormalize=True)
    summed = sum(
        moe_experts(x, p.w13, p.w2, weights, ids, p.hidden_act, p.w13_bias, p.w2_bias, p.w13_scale, p.w2_scale)
        for p in parts
    )
    torch.testing.assert_close(summed, mxfp4_layer(tensors)(x, logits), rtol=1e-5, atol=1e-5)


def test_a_rank_share_of_partial_blocks_is_refused():
    with pytest.raises(ValueError, match=r"\(64 / tensor_parallel_size 4 = 16\) must be whole multiples of: use"):
        layer(True, 0, 4)
