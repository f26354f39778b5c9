"""MXFP4's PyTorch reference: dequantized as transformers dequantizes gpt-oss's checkpoints (which nibble is
the even element, the scale's bias), and quantized to the nearest value."""

import pytest
import torch
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from nanovllm.kernels.mxfp4 import BLOCK, E2M1_VALUES, dequantize, quantize


def test_dequantized_as_transformers_dequantizes_a_checkpoints_blocks():
    torch.manual_seed(0)
    packed = torch.randint(0, 256, (3, 10, 64), dtype=torch.uint8)  # [experts, out, in / 2]
    scales = torch.randint(118, 136, (3, 10, 4), dtype=torch.uint8)  # [experts, out, in / 32]
    # transformers reads blocks [experts, out, in / 32, 16] and gives them inputs first
    want = convert_moe_packed_tensors(packed.view(3, 10, 4, BLOCK // 2), scales, dtype=torch.float32)
    torch.testing.assert_close(dequantize(packed, scales, torch.float32), want.transpose(1, 2), rtol=0, atol=0)


def test_the_low_nibble_is_the_even_element_and_127_scales_by_one():
    packed = torch.tensor([[0x2F] + [0] * 15], dtype=torch.uint8)  # element 0: nibble 0xF (-6), 1: 0x2 (1.0)
    values = dequantize(packed, torch.tensor([[127]], dtype=torch.uint8), torch.float32)
    assert values[0, :3].tolist() == [-6.0, 1.0, 0.0]
    assert dequantize(packed, torch.tensor([[130]], dtype=torch.uint8), torch.float32)[0, 0].item() == -48.0


def test_quantized_to_the_nearest_value_of_each_blocks_scale():
    torch.manual_seed(1)
    w = torch.randn(5, 96) * torch.logspace(-3, 1, 5)[:, None]  # blocks of very different magnitudes
    packed, scales = quantize(w)
    assert packed.shape == (5, 48) and scales.shape == (5, 3)
    got = dequantize(packed, scales, torch.float32)
    step = torch.ldexp(torch.ones(5, 3), scales.int() - 127).repeat_interleave(BLOCK, dim=1)
    # the largest magnitude of each block within e2m1's range at its scale; every value rounded to the nearest
    assert (w.abs().unflatten(1, (3, BLOCK)).amax(-1) <= 6 * step[:, ::BLOCK]).all()
    grid = torch.tensor(E2M1_VALUES)[None, None, :] * step[..., None]  # [5, 96, 16]
    assert ((got - w).abs() <= (grid - w[..., None]).abs().amin(-1) + 1e-12).all()
    # what is representable stays as it is
    assert torch.equal(dequantize(*quantize(got), torch.float32), got)


def test_inputs_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="multiple of 32, got 40"):
        quantize(torch.randn(2, 40))
