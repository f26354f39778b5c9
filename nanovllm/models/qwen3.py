"""Qwen3: the Llama decoder with RMSNorm on each head's q and k before rotary
(ModelConfig.qk_norm, which `ModelConfig.from_hf` sets for this family)."""

from nanovllm.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense models (0.6B ... 32B)."""
