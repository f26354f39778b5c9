"""Model classes keyed by the checkpoint's `architectures` entry, imported on first use.

Importing this package imports no model family; `model_class` imports the one
a checkpoint needs.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from nanovllm.models.model_config import ModelConfig

# architecture -> "module:class"
MODEL_REGISTRY: dict[str, str] = {
    "Gemma2ForCausalLM": "nanovllm.models.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "nanovllm.models.gemma3:Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration": "nanovllm.models.gemma3:Gemma3ForConditionalGeneration",
    "LlamaForCausalLM": "nanovllm.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "nanovllm.models.mistral:MistralForCausalLM",
    "MixtralForCausalLM": "nanovllm.models.mixtral:MixtralForCausalLM",
    "Phi3ForCausalLM": "nanovllm.models.phi3:Phi3ForCausalLM",
    "Qwen2ForCausalLM": "nanovllm.models.qwen2:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "nanovllm.models.qwen3:Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM": "nanovllm.models.qwen3_moe:Qwen3MoeForCausalLM",
}


def supported_architecture(architectures) -> str:
    """The first of `architectures` this engine implements, or a ValueError naming the supported ones."""
    for name in architectures:
        if name in MODEL_REGISTRY:
            return name
    raise ValueError(
        f"unsupported architecture {list(architectures) or '(none in config.json)'}; "
        f"supported: {', '.join(MODEL_REGISTRY)}"
    )


def model_class(model_config: "ModelConfig") -> "type[nn.Module]":
    """The class that implements the model's architecture (its module imported now)."""
    module_name, class_name = MODEL_REGISTRY[supported_architecture([model_config.architecture])].split(":")
    return getattr(importlib.import_module(module_name), class_name)
