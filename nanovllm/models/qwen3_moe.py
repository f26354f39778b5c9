"""Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's decoder (RMSNorm on each q and k head) with experts in place of the
dense MLP in every decoder_sparse_step-th layer but those in mlp_only_layers: the router's softmax picks
num_experts_per_tok of num_experts, their weights renormalised when norm_topk_prob. No shared expert. Its
checkpoints name the router mlp.gate and the experts mlp.experts.{e}.gate_proj, up_proj and down_proj: the
decoder's names."""

from nanovllm.models.family_spec import ExpertDefaults, FamilySpec, HFDefaults

QWEN3_MOE = FamilySpec(
    HFDefaults(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_key_value_heads=4,
        max_position_embeddings=32768,
    ),
    qk_norm=True,
    experts=ExpertDefaults(num_local_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
)
