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


def _gemma4_fields(**fields) -> dict:
    """A tiny Gemma 4 text model: sliding layers of 4 KV heads of 16, global ones of 2 KV heads of 32 rotated
    by proportional rotary (a quarter of their pairs), a soft-cap on the logits; no per-layer inputs unless
    `fields` ask for them."""
    defaults = dict(
        tiny_config(),
        num_hidden_layers=6,
        num_key_value_heads=4,
        global_head_dim=32,
        num_global_key_value_heads=2,
        sliding_window=WINDOW,
        final_logit_softcapping=5.0,
        hidden_size_per_layer_input=0,
        pad_token_id=0,  # the multimodal model masks image tokens with it
    )
    return {**defaults, **fields}


def _save_gemma4(model: torch.nn.Module, path) -> str:
    """Save `model` in fp32 with its norms, scales and layer scalars drawn at random: transformers starts them
    at 1, which would hide one left out."""
    for name, tensor in model.state_dict().items():
        if name.endswith(("norm.weight", "router.scale", "per_expert_scale")):
            tensor.normal_(1.0, 0.3)
        elif name.endswith("layer_scalar"):
            tensor.uniform_(0.5, 1.5)
    model.to(torch.float32).save_pretrained(path)
    save_tiny_tokenizer(path)
    return str(path)


def save_gemma4_dense(path, **fields) -> str:
    """Five sliding layers to one global whose V is its K projection's output (attention_k_eq_v); `fields`
    override the config's (head sizes, for example)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(0)
    config = Gemma4TextConfig(**_gemma4_fields(attention_k_eq_v=True, **fields))
    return _save_gemma4(Gemma4ForCausalLM(config), path)


def save_gemma4_shared_kv(path) -> str:
    """Layers sliding, sliding, full, sliding, sliding, full, the last two reading the K/V of layers 3 and 2
    (num_kv_shared_layers 2) with MLPs twice as wide; per-layer input embeddings of 8; global layers with a
    v_proj of their own."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    layer_types = ["sliding_attention", "sliding_attention", "full_attention"] * 2
    fields = _gemma4_fields(
        layer_types=layer_types,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=tiny_config()["vocab_size"],
    )
    torch.manual_seed(1)
    return _save_gemma4(Gemma4ForCausalLM(Gemma4TextConfig(**fields)), path)


def save_gemma4_moe(path) -> str:
    """The dense model's layers with four experts of 32 (two per token) beside each dense MLP."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    fields = _gemma4_fields(
        attention_k_eq_v=True, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32
    )
    torch.manual_seed(2)
    return _save_gemma4(Gemma4ForCausalLM(Gemma4TextConfig(**fields)), path)


def save_gemma4_multimodal(path) -> str:
    """A multimodal checkpoint of the dense text model with a tiny vision tower, which the engine does not
    load."""
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    vision = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        patch_size=4,
        pooling_kernel_size=2,
        position_embedding_size=64,
    )
    vocab_size = tiny_config()["vocab_size"]
    config = Gemma4Config(
        text_config=_gemma4_fields(attention_k_eq_v=True),
        vision_config=vision,
        audio_config=None,
        image_token_id=vocab_size - 1,
        boi_token_id=vocab_size - 2,
        eoi_token_id=vocab_size - 3,
    )
    torch.manual_seed(3)
    return _save_gemma4(Gemma4ForConditionalGeneration(config), path)
