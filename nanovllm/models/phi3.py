"""Phi-3 and Phi-4: Llama's decoder, loaded from checkpoints that store q|k|v and gate|up as one tensor each,
under the names of our fused projections (so nothing is renamed, and each tensor is split across ranks by
its shards)."""

from nanovllm.models.blocks import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    """Phi-3 (mini, small, medium) and Phi-4 with full rotary embedding and without LongRoPE."""

    packed_modules_mapping = {}
