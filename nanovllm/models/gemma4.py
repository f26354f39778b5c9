"""Gemma 4: Gemma 3's layout (five sliding layers to one global, sandwich norms, GeGLU, scaled and tied
embeddings, RMSNorm on each q and k head) with its own decoder (`gemma4_decoder`, its traits read by
`gemma4_layers`): norms that scale by their weight (not 1 + weight), an unweighted RMSNorm on each value head,
attention scores unscaled (the q/k norms set their size), global layers of their own head size and KV heads
(with attention_k_eq_v, V from the K projection) rotated by "proportional" partial rotary, a learned scalar on
each layer's output, and in some checkpoints K/V shared by the last layers, per-layer input embeddings and
experts beside each layer's dense MLP; the final logits soft-capped.

The text-only checkpoints (`Gemma4ForCausalLM`) and the multimodal ones
(`Gemma4ForConditionalGeneration`), which run as their language model: settings from text_config, weights
from the language-model tensors; the vision and audio towers and their embedders are not loaded, as this
engine takes text only (a request with an image or audio is refused).
"""

from dataclasses import replace

from nanovllm.models.family_spec import CheckpointNames, FamilySpec, HFDefaults, SlidingLayers

GEMMA4 = FamilySpec(
    HFDefaults(
        vocab_size=262144,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=30,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        max_position_embeddings=131072,
        hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True,
        sliding_window=512,
        sliding_window_pattern=6,
        rope_theta=1000000.0,
        # scores are not scaled: 1 ** -0.5
        query_pre_attn_scalar=1.0,
        # transformers' class leaves it None, but a config that names no soft-cap at all is read as the
        # published checkpoints' 30 (any config transformers writes names it, null or not)
        final_logit_softcapping=30.0,
    ),
    activation_key="hidden_activation",
    qk_norm=True,
    sandwich_norms=True,
    scaled_embeddings=True,
    sliding_layers=SlidingLayers.PER_LAYER_TYPE,
    sliding_rope_theta=10000.0,
    gemma4_layers=True,
)

GEMMA4_MULTIMODAL = replace(
    GEMMA4,
    language_model_in_text_config=True,
    # checkpoint prefix -> ours, None for tensors not loaded
    checkpoint=CheckpointNames(
        prefixes={
            "model.language_model.": "model.",
            "model.vision_tower.": None,
            "model.audio_tower.": None,
            "model.embed_vision.": None,
            "model.embed_audio.": None,
        }
    ),
)
