"""Rotary embedding tables against transformers' inverse frequencies."""

import torch
from transformers import Gemma4TextConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from nanovllm.layers.rotary_embedding import RotaryEmbedding


def test_proportional_rotary_turns_the_first_quarter_of_the_pairs_over_the_whole_head():
    # Gemma 4's global layers: head_dim 32, a quarter of its 16 pairs turn at the frequencies a whole head
    # would give them (not those of a 8-dimension rotary), the others pass through
    config = Gemma4TextConfig(num_hidden_layers=6, head_dim=16, global_head_dim=32)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu", layer_type="full_attention")
    params = {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25}
    rotary = RotaryEmbedding(32, 64, params)
    positions = torch.arange(64, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq).repeat(1, 2)  # transformers' cat((freqs, freqs))
    assert torch.allclose(rotary.cos_sin[:, 0], angles.cos()) and torch.allclose(rotary.cos_sin[:, 1], angles.sin())
    assert int((inv_freq != 0).sum()) == 4
    # the still pairs leave a head as it is
    q = torch.randn(64, 1, 32)
    rotated, _ = rotary(torch.arange(64), q, q)
    still = torch.cat((torch.arange(4, 16), torch.arange(20, 32)))
    assert torch.equal(rotated[..., still], q[..., still]) and not torch.allclose(rotated, q)
