"""Mixtral 8x7B and 8x22B: Mistral's decoder with experts in every layer's place of the MLP, each token through
the two (num_experts_per_tok) of eight (num_local_experts) its router's softmax ranks first, each expert
intermediate_size wide, their weights always renormalised to sum to 1 (its config has no norm_topk_prob:
transformers' Mixtral always does). Its published checkpoints name the block block_sparse_moe and each expert's
gate, down and up projections w1, w2 and w3; transformers 5 writes stacked experts under the decoder's names."""

from nanovllm.models.family_spec import CheckpointNames, ExpertDefaults, FamilySpec, HFDefaults, SlidingLayers

MIXTRAL = FamilySpec(
    HFDefaults(
        intermediate_size=14336,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=1000000.0,
    ),
    sliding_layers=SlidingLayers.ALL,
    experts=ExpertDefaults(num_local_experts=8, num_experts_per_tok=2, norm_topk_prob=True, config_sets_layout=False),
    checkpoint=CheckpointNames(
        renames={".block_sparse_moe.": ".mlp."},
        expert_weights={"w1": ("w13", "gate"), "w3": ("w13", "up"), "w2": ("w2", "down")},
    ),
)
