"""Gemma 3: the decoder of `blocks` with the options `ModelConfig.from_hf` sets for this family.

Gemma 2's layers (norms scaling by 1 + weight before and after attention and
the MLP, GeGLU, scaled embeddings, query_pre_attn_scalar) with an RMSNorm on
each q and k head and no soft-caps; five sliding layers to one global
(sliding_window_pattern, or the config's layer_types), the sliding ones
rotated at a base of their own (rope_local_base_freq, 10,000) and the global
ones at rope_theta (1,000,000) with the config's scaling.

The image-text checkpoints (`Gemma3ForConditionalGeneration`: 4B, 12B, 27B)
run as their language model: its settings come from the config's
text_config and its weights from the checkpoint's language-model tensors; the
vision tower and its projector are not loaded, as this engine takes text only
(a request with an image is refused).
"""

from nanovllm.models.blocks import DecoderForCausalLM


class Gemma3ForCausalLM(DecoderForCausalLM):
    """Gemma 3's text-only checkpoints (1B), and any Gemma 3 language model saved on its own."""


class Gemma3ForConditionalGeneration(DecoderForCausalLM):
    """The language model of Gemma 3's image-text checkpoints."""

    # checkpoint prefix -> ours, None for tensors not loaded: transformers 5's names, then earlier ones
    checkpoint_prefixes = {
        "model.language_model.": "model.",
        "model.vision_tower.": None,
        "model.multi_modal_projector.": None,
        "language_model.model.": "model.",
        "language_model.lm_head.": "lm_head.",
        "vision_tower.": None,
        "multi_modal_projector.": None,
    }
