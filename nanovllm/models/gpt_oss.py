"""gpt-oss (20b, 120b): a decoder whose layers alternate a 128-token sliding window with full attention, each
head with a learned sink logit in its softmax sum, q, k, v and o with biases, YaRN rotary; and experts in every
layer (32 or 128, four per token) chosen by a biased router (top-k of its logits, then a softmax over those:
the renormalised top-k of the softmax), each expert biased and activated by a clamped SwiGLU. Its checkpoints
stack each layer's experts inputs first with gate and up interleaved, and name the router `mlp.router`; the
published ones hold the experts in MXFP4 (`_blocks` and `_scales`, outputs first: `layers/fused_moe.py`)."""

from nanovllm.models.family_spec import CheckpointNames, ExpertDefaults, FamilySpec, HFDefaults, SlidingLayers

GPT_OSS = FamilySpec(
    HFDefaults(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=36,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=150000.0,
        attention_bias=True,
        sliding_window=128,
    ),
    sliding_layers=SlidingLayers.PER_LAYER_TYPE,
    attention_sinks=True,
    experts=ExpertDefaults(
        num_local_experts=128,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        config_sets_layout=False,
        biased=True,
        activation="gpt_oss_swiglu",  # layers/activation.py: GPT_OSS_SWIGLU
    ),
    checkpoint=CheckpointNames(
        renames={".mlp.router.": ".mlp.gate."},
        stacked_expert_weights={
            "gate_up_proj": "w13",
            "down_proj": "w2",
            "gate_up_proj_bias": "w13_bias",
            "down_proj_bias": "w2_bias",
            "gate_up_proj_blocks": "w13",
            "gate_up_proj_scales": "w13_scale",
            "down_proj_blocks": "w2",
            "down_proj_scales": "w2_scale",
        },
        experts_inputs_first=True,
    ),
)
