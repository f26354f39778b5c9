"""Tiny random Gemma 2 and Gemma 3 models saved with transformers, their sliding layers attending over
WINDOW tokens, and their norm weights drawn at random."""

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3Config,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
)

from helpers.tiny_models import save_tiny_tokenizer, tiny_config

WINDOW = 24
GEMMA3_TEXT_FIELDS = dict(
    tiny_config(),
    num_hidden_layers=6,  # layers 0-4 slide, layer 5 is global
    sliding_window=WINDOW,
    query_pre_attn_scalar=24,
    rope_theta=10000.0,
    rope_local_base_freq=500.0,
    rope_scaling={"rope_type": "linear", "factor": 4.0},
)


def randomize_norms(model: torch.nn.Module) -> None:
    """Norm weights drawn at random: transformers starts them at 0 (a scale of 1 + 0), which would hide a
    norm read as `weight`, q/k norms among them."""
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            parameter.data.normal_(0.0, 0.3)


def _save(model: torch.nn.Module, path) -> str:
    randomize_norms(model)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def save_gemma2(path) -> str:
    """Four layers (sliding, full, sliding, full); a soft-cap of 4 that these attention scores reach, and
    a query scale (query_pre_attn_scalar 24) other than head_dim's."""
    fields = dict(
        tiny_config(),
        num_hidden_layers=4,
        sliding_window=WINDOW,
        attn_logit_softcapping=4.0,
        final_logit_softcapping=5.0,
        query_pre_attn_scalar=24,
    )
    torch.manual_seed(0)
    return _save(Gemma2ForCausalLM(Gemma2Config(**fields)), path)


def save_gemma3(path) -> str:
    """A text model: five sliding layers to one global, the sliding ones rotated at their own base, the
    global one scaled."""
    torch.manual_seed(0)
    return _save(Gemma3ForCausalLM(Gemma3TextConfig(**GEMMA3_TEXT_FIELDS)), path)


def save_gemma3_image_text(path) -> str:
    """An image-text checkpoint of the same text model with a tiny vision tower, which the engine does not
    load."""
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    vocab_size = GEMMA3_TEXT_FIELDS["vocab_size"]
    config = Gemma3Config(
        text_config=GEMMA3_TEXT_FIELDS,
        vision_config=dict(vision, image_size=28, patch_size=14),
        mm_tokens_per_image=4,
        image_token_index=vocab_size - 1,
        boi_token_index=vocab_size - 2,
        eoi_token_index=vocab_size - 3,
    )
    torch.manual_seed(1)
    return _save(Gemma3ForConditionalGeneration(config), path)
