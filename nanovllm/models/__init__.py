"""Model classes keyed by the checkpoint's `architectures` entry."""

from torch import nn

from nanovllm.models.llama import LlamaForCausalLM
from nanovllm.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def model_class(hf_config) -> type[nn.Module]:
    """The class that implements the checkpoint's architecture, or a clear error."""
    architectures = getattr(hf_config, "architectures", None) or []
    for name in architectures:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(
        f"unsupported architecture {architectures or '(none in config.json)'}; "
        f"supported: {', '.join(MODEL_REGISTRY)}"
    )
