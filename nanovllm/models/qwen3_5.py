"""Qwen3.5 dense models: three Gated DeltaNet (linear attention) layers to one full-attention layer (the
config's layer_types, else every full_attention_interval-th layer attends). The attention layers have
Qwen3's RMSNorm on each q and k head, an output gate (q_proj gives each head its q and a gate, and the
attention's output is multiplied by sigmoid(gate)) and rotary on the first quarter of each head; every
RMSNorm but the Gated DeltaNet's own scales by 1 + weight. The checkpoints keep the Gated DeltaNet's input
projections as four tensors (q|k|v, z, b, a), which fill two fused projections (q|k|v|z and b|a); their
multi-token-prediction layer (mtp.) is loaded only for speculative method "mtp" (`models/mtp.py`), and the
vision tower of image-text checkpoints never.

`Qwen3_5ForCausalLM` checkpoints hold the language model alone; `Qwen3_5ForConditionalGeneration` ones
(every released size) run as their language model: its settings come from the config's text_config and its
weights from the checkpoint's language-model tensors.
"""

from dataclasses import replace

from nanovllm.models.family_spec import (
    SEPARATE_PROJECTIONS,
    CheckpointNames,
    FamilySpec,
    HFDefaults,
    LinearAttentionDefaults,
)

# the Gated DeltaNet's input projections -> (our fused projection, the shards each fills): in_proj_qkv holds q|k|v
GATED_DELTA_NET_PROJECTIONS = {
    "in_proj_qkv": ("in_proj_qkvz", ("q", "k", "v")),
    "in_proj_z": ("in_proj_qkvz", "z"),
    "in_proj_b": ("in_proj_ba", "b"),
    "in_proj_a": ("in_proj_ba", "a"),
}

QWEN3_5 = FamilySpec(
    HFDefaults(
        vocab_size=248320,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        max_position_embeddings=32768,
        partial_rotary_factor=0.25,
    ),
    qk_norm=True,
    norm_unit_offset=True,
    attn_output_gate=True,
    multi_token_prediction=True,
    linear_attention=LinearAttentionDefaults(
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
    ),
    checkpoint=CheckpointNames(
        prefixes={"mtp.": None, "model.visual.": None},
        packed_modules={**SEPARATE_PROJECTIONS, **GATED_DELTA_NET_PROJECTIONS},
    ),
)

QWEN3_5_IMAGE_TEXT = replace(
    QWEN3_5,
    language_model_in_text_config=True,
    checkpoint=replace(
        QWEN3_5.checkpoint, prefixes={"model.language_model.": "model.", "model.visual.": None, "mtp.": None}
    ),
)
