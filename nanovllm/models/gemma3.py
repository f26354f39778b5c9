"""Gemma 3: Gemma 2's layers (norms scaling by 1 + weight before and after attention and the MLP, GeGLU,
scaled embeddings, query_pre_attn_scalar) with an RMSNorm on each q and k head and no soft-caps; five sliding
layers to one global (sliding_window_pattern, or the config's layer_types), the sliding ones rotated at a base
of their own (rope_local_base_freq, 10,000) and the global ones at rope_theta (1,000,000) with the config's
scaling.

The text-only checkpoints (`Gemma3ForCausalLM`: 1B, and any Gemma 3 language model saved on its own) and the
image-text ones (`Gemma3ForConditionalGeneration`: 4B, 12B, 27B), which run as their language model: its
settings come from the config's text_config and its weights from the checkpoint's language-model tensors; the
vision tower and its projector are not loaded, as this engine takes text only (a request with an image is
refused).
"""

from dataclasses import replace

from nanovllm.models.family_spec import CheckpointNames
from nanovllm.models.gemma2 import GEMMA2

GEMMA3 = replace(
    GEMMA2,
    defaults=replace(
        GEMMA2.defaults,
        vocab_size=262208,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        sliding_window_pattern=6,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
    ),
    qk_norm=True,
    sliding_rope_theta=10000.0,
)

GEMMA3_IMAGE_TEXT = replace(
    GEMMA3,
    language_model_in_text_config=True,
    # checkpoint prefix -> ours, None for tensors not loaded: transformers 5's names, then earlier ones
    checkpoint=CheckpointNames(
        prefixes={
            "model.language_model.": "model.",
            "model.vision_tower.": None,
            "model.multi_modal_projector.": None,
            "language_model.model.": "model.",
            "language_model.lm_head.": "lm_head.",
            "vision_tower.": None,
            "multi_modal_projector.": None,
        }
    ),
)
