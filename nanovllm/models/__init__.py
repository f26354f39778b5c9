"""Model classes keyed by the checkpoint's `architectures` entry."""

from torch import nn

from nanovllm.models.llama import LlamaForCausalLM
from nanovllm.models.model_config import ModelConfig
from nanovllm.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
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


def model_class(model_config: ModelConfig) -> type[nn.Module]:
    """The class that implements the model's architecture."""
    return MODEL_REGISTRY[supported_architecture([model_config.architecture])]
