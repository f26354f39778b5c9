"""Qwen2 and Qwen2.5: the decoder of `blocks` with a bias on the q, k and v projections
(ModelConfig.qkv_bias, which `ModelConfig.from_hf` sets for this family)."""

from nanovllm.models.blocks import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    """Qwen2 and Qwen2.5 dense models (0.5B ... 72B)."""
