"""Gemma 2: the decoder of `blocks` with the options `ModelConfig.from_hf` sets for this family.

Sliding-window layers alternate with global ones (config layer_types, else every
even layer slides); attention scores are scaled by query_pre_attn_scalar ** -0.5
and soft-capped (attn_logit_softcapping), as are the final logits
(final_logit_softcapping); RMSNorm scales by 1 + weight and also normalises the
attention's and the MLP's outputs; the MLP is GeGLU (tanh GELU); embeddings are
multiplied by sqrt(hidden_size) and tied to the LM head.
"""

from nanovllm.models.blocks import DecoderForCausalLM


class Gemma2ForCausalLM(DecoderForCausalLM):
    """Gemma 2 (2B, 9B, 27B)."""
