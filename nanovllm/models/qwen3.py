"""Qwen3: the decoder of `blocks` with RMSNorm on each head's q and k before rotary
(ModelConfig.qk_norm, which `ModelConfig.from_hf` sets for this family)."""

from nanovllm.models.blocks import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    """Qwen3 dense models (0.6B ... 32B)."""
