"""Qwen3 dense models (0.6B ... 32B): Llama's decoder with RMSNorm on each head's q and k before rotary."""

from nanovllm.models.family_spec import FamilySpec, HFDefaults

QWEN3 = FamilySpec(
    HFDefaults(vocab_size=151936, intermediate_size=22016, head_dim=128, max_position_embeddings=32768),
    qk_norm=True,
)
