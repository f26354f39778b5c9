"""Mistral: Llama's decoder. Version 0.1's sliding window comes in as ModelConfig.sliding_window, on every
layer, and each attention layer passes it to the attention backend."""

from nanovllm.models.blocks import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    """Mistral 7B (v0.1 to v0.3) and the models of its architecture."""
