"""Mistral 7B (v0.1 to v0.3) and the models of its architecture: Llama's decoder. Version 0.1 attends over a
4096-token sliding window on every layer; later versions' configs say null."""

from nanovllm.models.family_spec import FamilySpec, HFDefaults, SlidingLayers

MISTRAL = FamilySpec(
    HFDefaults(intermediate_size=14336, num_key_value_heads=8, max_position_embeddings=131072, sliding_window=4096),
    sliding_layers=SlidingLayers.ALL,
)
