"""Qwen3.5 mixture-of-experts models (Qwen3.5-35B-A3B and its kin): Qwen3.5's decoder (Gated DeltaNet and
gated full-attention layers, `qwen3_5`) with experts in place of every layer's MLP. The router's softmax
picks num_experts_per_tok of num_experts, their weights always renormalised to sum to 1 (transformers'
class has no norm_topk_prob, nor dense layers), and one shared expert of shared_expert_intermediate_size,
which every token runs through, adds its output times sigmoid(shared_expert_gate(x)), a Linear hidden -> 1.

The checkpoints hold the experts one tensor each (mlp.experts.{e}.gate_proj, up_proj and down_proj, as
transformers saves them) or stacked (mlp.experts.gate_up_proj and down_proj, as it holds them); both load.
The router is mlp.gate, the shared expert mlp.shared_expert.gate_proj, up_proj and down_proj, and its gate
mlp.shared_expert_gate, which the decoder keeps in the shared expert (mlp.shared_expert.gate). As in the
dense family, `Qwen3_5MoeForConditionalGeneration` checkpoints run as their language model.
"""

from dataclasses import replace

from nanovllm.models.family_spec import ExpertDefaults, HFDefaults
from nanovllm.models.qwen3_5 import QWEN3_5, QWEN3_5_IMAGE_TEXT

# the shared expert's gate, a sibling of the shared expert in the checkpoint, sits inside it here
_SHARED_EXPERT_GATE = {".mlp.shared_expert_gate.": ".mlp.shared_expert.gate."}

QWEN3_5_MOE = replace(
    QWEN3_5,
    defaults=HFDefaults(
        vocab_size=248320,
        hidden_size=2048,
        num_hidden_layers=40,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        max_position_embeddings=32768,
        partial_rotary_factor=0.25,
    ),
    experts=ExpertDefaults(
        num_local_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=512,
        norm_topk_prob=True,
        config_sets_layout=False,
        shared_expert_intermediate_size=512,
    ),
    checkpoint=replace(QWEN3_5.checkpoint, renames=_SHARED_EXPERT_GATE),
)

QWEN3_5_MOE_IMAGE_TEXT = replace(
    QWEN3_5_MOE,
    language_model_in_text_config=True,
    checkpoint=replace(QWEN3_5_IMAGE_TEXT.checkpoint, renames=_SHARED_EXPERT_GATE),
)
