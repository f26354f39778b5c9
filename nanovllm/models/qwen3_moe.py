"""Qwen3-MoE: Qwen3's decoder (RMSNorm on each q and k head) with experts in place of the dense MLP in the
layers `ModelConfig.moe_layers` names (every decoder_sparse_step-th, but those in mlp_only_layers): the
router's softmax picks num_experts_per_tok of num_experts, their weights renormalised when norm_topk_prob.
No shared expert. Its checkpoints name the router mlp.gate and the experts mlp.experts.{e}.gate_proj,
up_proj and down_proj: the decoder's names."""

from nanovllm.models.blocks import DecoderForCausalLM


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    """Qwen3-MoE (30B-A3B, 235B-A22B)."""
