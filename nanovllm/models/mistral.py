"""Mistral: Llama's decoder. Version 0.1's sliding window comes in as ModelConfig.sliding_window, which the
engine honours by refusing a context longer than the window (where the window changes nothing)."""

from nanovllm.models.blocks import DecoderForCausalLM


class MistralForCausalLM(DecoderForCausalLM):
    """Mistral 7B (v0.1 to v0.3) and the models of its architecture."""
