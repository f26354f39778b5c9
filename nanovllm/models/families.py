"""The model families, keyed by the checkpoint's `architectures` entry, each imported on first use.

A family is one small file that declares its `FamilySpec` (see `family_spec`)
and imports no torch, so that reading a config loads neither torch nor the
other families. Adding a family that the decoder's options cover is adding its
file and its line in `FAMILIES`.

This module imports no other nanovllm module when it runs (the family files
are imported by name, on first use), so that `model_config` imports it without
a cycle.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanovllm.models.family_spec import FamilySpec

# architecture -> "module:spec" of the family file that declares it
FAMILIES: dict[str, str] = {
    "Gemma2ForCausalLM": "nanovllm.models.gemma2:GEMMA2",
    "Gemma3ForCausalLM": "nanovllm.models.gemma3:GEMMA3",
    "Gemma3ForConditionalGeneration": "nanovllm.models.gemma3:GEMMA3_IMAGE_TEXT",
    "LlamaForCausalLM": "nanovllm.models.llama:LLAMA",
    "MistralForCausalLM": "nanovllm.models.mistral:MISTRAL",
    "MixtralForCausalLM": "nanovllm.models.mixtral:MIXTRAL",
    "Phi3ForCausalLM": "nanovllm.models.phi3:PHI3",
    "Qwen2ForCausalLM": "nanovllm.models.qwen2:QWEN2",
    "Qwen3ForCausalLM": "nanovllm.models.qwen3:QWEN3",
    "Qwen3MoeForCausalLM": "nanovllm.models.qwen3_moe:QWEN3_MOE",
    "Qwen3_5ForCausalLM": "nanovllm.models.qwen3_5:QWEN3_5",
    "Qwen3_5ForConditionalGeneration": "nanovllm.models.qwen3_5:QWEN3_5_IMAGE_TEXT",
    "Qwen3_5MoeForCausalLM": "nanovllm.models.qwen3_5_moe:QWEN3_5_MOE",
    "Qwen3_5MoeForConditionalGeneration": "nanovllm.models.qwen3_5_moe:QWEN3_5_MOE_IMAGE_TEXT",
}


def supported_architecture(architectures) -> str:
    """The first of `architectures` this engine implements, or a ValueError naming the supported ones."""
    for name in architectures:
        if name in FAMILIES:
            return name
    raise ValueError(
        f"unsupported architecture {list(architectures) or '(none in config.json)'}; supported: {', '.join(FAMILIES)}"
    )


def family_of(architecture: str) -> "FamilySpec":
    """The spec of a supported architecture (its family file imported now)."""
    module_name, spec_name = FAMILIES[architecture].split(":")
    return getattr(importlib.import_module(module_name), spec_name)
