"""The model families, keyed by the checkpoint's `architectures` entry, each imported on first use.

A family is one small file that declares its `FamilySpec` (see `family_spec`)
and imports no torch, so that reading a config loads neither torch nor the
other families. Adding a family that the decoder's options cover is adding its
file and its line in `FAMILIES`. Hybrid and linear-attention architectures
whose layers the engine lacks are listed in `UNSUPPORTED_LAYERS`, so that the
refusal of one names those layers and the hybrid models the engine runs.

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
    "Gemma4ForCausalLM": "nanovllm.models.gemma4:GEMMA4",
    "Gemma4ForConditionalGeneration": "nanovllm.models.gemma4:GEMMA4_MULTIMODAL",
    "GptOssForCausalLM": "nanovllm.models.gpt_oss:GPT_OSS",
    "LlamaForCausalLM": "nanovllm.models.llama:LLAMA",
    "MistralForCausalLM": "nanovllm.models.mistral:MISTRAL",
    "MixtralForCausalLM": "nanovllm.models.mixtral:MIXTRAL",
    "Phi3ForCausalLM": "nanovllm.models.phi3:PHI3",
    "Qwen2ForCausalLM": "nanovllm.models.qwen2:QWEN2",
    "Qwen3ForCausalLM": "nanovllm.models.qwen3:QWEN3",
    "Qwen3MoeForCausalLM": "nanovllm.models.qwen3_moe:QWEN3_MOE",
    "Qwen3NextForCausalLM": "nanovllm.models.qwen3_next:QWEN3_NEXT",
    "Qwen3_5ForCausalLM": "nanovllm.models.qwen3_5:QWEN3_5",
    "Qwen3_5ForConditionalGeneration": "nanovllm.models.qwen3_5:QWEN3_5_IMAGE_TEXT",
    "Qwen3_5MoeForCausalLM": "nanovllm.models.qwen3_5_moe:QWEN3_5_MOE",
    "Qwen3_5MoeForConditionalGeneration": "nanovllm.models.qwen3_5_moe:QWEN3_5_MOE_IMAGE_TEXT",
}


# hybrid and linear-attention architectures whose sequence-mixing layers this engine does not implement ->
# those layers, so that the refusal of one names what it lacks rather than only the architecture
UNSUPPORTED_LAYERS: dict[str, str] = {
    "KimiLinearForCausalLM": "Kimi Delta Attention, a linear-attention layer",
    "MiniMaxForCausalLM": "lightning attention, a linear-attention layer",
    "MambaForCausalLM": "Mamba state-space layers",
    "FalconMambaForCausalLM": "Mamba state-space layers",
    "JambaForCausalLM": "Mamba state-space layers",
    "ZambaForCausalLM": "Mamba state-space layers",
    "Mamba2ForCausalLM": "Mamba-2 state-space layers",
    "BambaForCausalLM": "Mamba-2 state-space layers",
    "FalconH1ForCausalLM": "Mamba-2 state-space layers",
    "GraniteMoeHybridForCausalLM": "Mamba-2 state-space layers",
    "NemotronHForCausalLM": "Mamba-2 state-space layers",
    "Zamba2ForCausalLM": "Mamba-2 state-space layers",
    "Lfm2ForCausalLM": "gated short convolutions",
    "Lfm2MoeForCausalLM": "gated short convolutions",
    "RecurrentGemmaForCausalLM": "RG-LRU recurrent layers",
    "RwkvForCausalLM": "RWKV's time-mixing recurrence",
    "xLSTMForCausalLM": "mLSTM recurrent layers",
}


def supported_architecture(architectures) -> str:
    """The first of `architectures` this engine implements, or a ValueError: for one in `UNSUPPORTED_LAYERS`
    naming the layers it lacks and the hybrid models it runs, else naming the supported architectures."""
    for name in architectures:
        if name in FAMILIES:
            return name
    for name in architectures:
        if name in UNSUPPORTED_LAYERS:
            raise ValueError(
                f"{name} uses {UNSUPPORTED_LAYERS[name]}, which this engine does not implement; the hybrid "
                f"linear-attention models it runs (Gated DeltaNet layers beside full attention) are "
                f"{', '.join(_hybrid_architectures())}; supported: {', '.join(FAMILIES)}"
            )
    raise ValueError(
        f"unsupported architecture {list(architectures) or '(none in config.json)'}; supported: {', '.join(FAMILIES)}"
    )


def family_of(architecture: str) -> "FamilySpec":
    """The spec of a supported architecture (its family file imported now)."""
    module_name, spec_name = FAMILIES[architecture].split(":")
    return getattr(importlib.import_module(module_name), spec_name)


def _hybrid_architectures() -> list[str]:
    """The supported architectures with linear-attention layers (every family file imported now)."""
    return [name for name in FAMILIES if family_of(name).linear_attention is not None]
