"""Qwen2 and Qwen2.5 dense models (0.5B ... 72B): Llama's decoder with a bias on the q, k and v projections
(none on o_proj)."""

from nanovllm.models.family_spec import FamilySpec, HFDefaults

QWEN2 = FamilySpec(
    HFDefaults(vocab_size=151936, intermediate_size=22016, max_position_embeddings=32768),
    bias_on_qkv_only=True,
)
