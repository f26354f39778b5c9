"""Llama family (Llama 2/3, SmolLM2): the plain pre-norm decoder of `blocks`."""

from nanovllm.models.blocks import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    """Llama-architecture checkpoints; Llama 3.1 rope scaling comes in through ModelConfig.rope_parameters."""
