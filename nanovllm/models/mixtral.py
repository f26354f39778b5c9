"""Mixtral: Mistral's decoder with experts in every layer's place of the MLP, each token through the two
(num_experts_per_tok) of eight (num_local_experts) its router's softmax ranks first, their weights
renormalised to sum to 1. Its published checkpoints name the block block_sparse_moe and each expert's gate,
down and up projections w1, w2 and w3; transformers 5 writes stacked experts under the decoder's names."""

from nanovllm.models.blocks import DecoderForCausalLM


class MixtralForCausalLM(DecoderForCausalLM):
    """Mixtral 8x7B and 8x22B."""

    checkpoint_renames = {".block_sparse_moe.": ".mlp."}
    expert_weights = {"w1": ("w13", "gate"), "w3": ("w13", "up"), "w2": ("w2", "down")}
