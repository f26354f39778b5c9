"""Phi-3 and Phi-4: Llama's decoder, loaded from checkpoints that store q|k|v and gate|up as one tensor each,
under the names of our fused projections (so nothing is renamed, and each tensor is split across ranks by
its shards)."""

from nanovllm.models.blocks import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    """Phi-3 (mini, small, medium), Phi-3.5, Phi-4 and Phi-4-mini (whose rotary turns the first 0.75 of each
    head: ModelConfig.rotary_dim), with LongRoPE for the 128k-context versions (rope_type 'longrope')."""

    packed_modules_mapping = {}
