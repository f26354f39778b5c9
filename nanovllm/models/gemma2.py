"""Gemma 2 (2B, 9B, 27B): sliding-window layers alternate with global ones (config layer_types, else every
even layer slides); attention scores are scaled by query_pre_attn_scalar ** -0.5 and soft-capped
(attn_logit_softcapping), as are the final logits (final_logit_softcapping); RMSNorm scales by 1 + weight and
also normalises the attention's and the MLP's outputs; the MLP is GeGLU (tanh GELU); embeddings are multiplied
by sqrt(hidden_size) and tied to the LM head."""

from nanovllm.models.family_spec import FamilySpec, HFDefaults, SlidingLayers

GEMMA2 = FamilySpec(
    HFDefaults(
        vocab_size=256000,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        max_position_embeddings=8192,
        hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        sliding_window=4096,
        sliding_window_pattern=2,
        query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    ),
    activation_key="hidden_activation",
    norm_unit_offset=True,
    sandwich_norms=True,
    scaled_embeddings=True,
    sliding_layers=SlidingLayers.PER_LAYER_TYPE,
)
