"""Qwen3-Next models (Qwen3-Next-80B-A3B and its kin): the layers of Qwen3.5's mixture-of-experts models
(`qwen3_5_moe`): three Gated DeltaNet layers to one gated full-attention layer (the config's layer_types,
else every full_attention_interval-th layer attends) with q and k RMSNorm per head and rotary on the first
quarter of each head, every RMSNorm but the Gated DeltaNet's own scaling by 1 + weight, and routed experts
beside a shared expert scaled by sigmoid(shared_expert_gate(x)).

Unlike Qwen3.5-MoE, the config sets the router and the layout as in Qwen2-MoE: norm_topk_prob says whether
the chosen experts' weights are renormalised, and the layers in mlp_only_layers or off every
decoder_sparse_step-th keep a dense MLP of intermediate_size. The checkpoints hold the Gated DeltaNet's input
projections as two tensors, in_proj_qkvz and in_proj_ba, whose rows are grouped per key head (for each key
head its q, k, then the v and z of the value heads that read it; and its value heads' b, then their a): they
fill the shards of the fused projections of the same names (`PerKeyHead`). The multi-token-prediction layer
(mtp.) is loaded only for speculative method "mtp" (`models/mtp.py`).
"""

from dataclasses import replace

from nanovllm.layers.per_key_head import PerKeyHead
from nanovllm.models.family_spec import (
    SEPARATE_PROJECTIONS,
    CheckpointNames,
    ExpertDefaults,
    HFDefaults,
)
from nanovllm.models.qwen3_5_moe import QWEN3_5_MOE

QWEN3_NEXT = replace(
    QWEN3_5_MOE,
    defaults=HFDefaults(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        max_position_embeddings=32768,
        partial_rotary_factor=0.25,
    ),
    experts=ExpertDefaults(
        num_local_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=512,
        norm_topk_prob=True,
        shared_expert_intermediate_size=512,
    ),
    checkpoint=CheckpointNames(
        prefixes={"mtp.": None},
        renames=QWEN3_5_MOE.checkpoint.renames,
        packed_modules={
            **SEPARATE_PROJECTIONS,
            "in_proj_qkvz": ("in_proj_qkvz", PerKeyHead(("q", "k", "v", "z"))),
            "in_proj_ba": ("in_proj_ba", PerKeyHead(("b", "a"))),
        },
    ),
)
