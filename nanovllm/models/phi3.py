"""Phi-3 (mini, small, medium), Phi-3.5, Phi-4 and Phi-4-mini: Llama's decoder, loaded from checkpoints that
store q|k|v and gate|up as one tensor each, under the names of our fused projections (so nothing is renamed,
and each tensor is split across ranks by its shards). Phi-4-mini's rotary turns the first 0.75 of each head
(ModelConfig.rotary_dim); the 128k-context versions use LongRoPE (rope_type 'longrope'). A sliding window, where
the config sets one, is on every layer."""

from nanovllm.models.family_spec import CheckpointNames, FamilySpec, HFDefaults, SlidingLayers

PHI3 = FamilySpec(
    HFDefaults(
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        original_max_position_embeddings=4096,
    ),
    sliding_layers=SlidingLayers.ALL,
    # LongRoPE's earlier names, which transformers' Phi3Config reads as longrope
    rope_type_aliases={"su": "longrope", "yarn": "longrope"},
    checkpoint=CheckpointNames(packed_modules={}),
)
