"""A tiny random model of every family in the registry (`nanovllm.models.families.FAMILIES`), keyed by the
architecture its config.json names: what checks over all the families build their models with."""

from collections.abc import Callable
from functools import partial

from transformers import MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from helpers.gemma_models import (
    WINDOW,
    save_gemma2,
    save_gemma3,
    save_gemma3_image_text,
    save_gemma4_multimodal,
    save_gemma4_shared_kv,
)
from helpers.moe_models import save_gpt_oss, save_mixtral, save_qwen3_moe
from helpers.qwen3_5_models import (
    save_qwen3_5,
    save_qwen3_5_image_text,
    save_qwen3_5_moe,
    save_qwen3_5_moe_image_text,
)
from helpers.qwen3_next_models import save_qwen3_next
from helpers.tiny_models import save_model, save_tiny_model


def _save_tiny(arch: str, path, **kwargs) -> str:
    save_tiny_model(path, arch, **kwargs)
    return str(path)


# architecture -> a function that saves a tiny model of it in a folder and returns the folder
FAMILY_MODELS: dict[str, Callable[..., str]] = {
    "Gemma2ForCausalLM": save_gemma2,
    "Gemma3ForCausalLM": save_gemma3,
    "Gemma3ForConditionalGeneration": save_gemma3_image_text,
    "Gemma4ForCausalLM": save_gemma4_shared_kv,
    "Gemma4ForConditionalGeneration": save_gemma4_multimodal,
    "LlamaForCausalLM": partial(_save_tiny, "llama", tie=True),
    # every layer slides over WINDOW tokens, which the families' checks run past
    "MistralForCausalLM": partial(
        save_model, config_class=MistralConfig, model_class=MistralForCausalLM, sliding_window=WINDOW
    ),
    "GptOssForCausalLM": save_gpt_oss,
    "MixtralForCausalLM": save_mixtral,
    "Phi3ForCausalLM": partial(save_model, config_class=Phi3Config, model_class=Phi3ForCausalLM),
    "Qwen2ForCausalLM": partial(
        save_model, config_class=Qwen2Config, model_class=Qwen2ForCausalLM, randomize_biases=True
    ),
    "Qwen3ForCausalLM": partial(_save_tiny, "qwen3"),
    "Qwen3MoeForCausalLM": save_qwen3_moe,
    "Qwen3NextForCausalLM": save_qwen3_next,
    "Qwen3_5ForCausalLM": save_qwen3_5,
    "Qwen3_5ForConditionalGeneration": save_qwen3_5_image_text,
    "Qwen3_5MoeForCausalLM": save_qwen3_5_moe,
    "Qwen3_5MoeForConditionalGeneration": save_qwen3_5_moe_image_text,
}
