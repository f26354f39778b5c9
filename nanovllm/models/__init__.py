"""The models: the family registry of `families` (re-exported here) and the class that builds a model.

Every family but Gemma 4 runs on the decoder of `blocks` (Gemma 4 on `gemma4_decoder`), which `model_class` imports on
first use, so that importing this package loads no torch.
"""

from typing import TYPE_CHECKING

from nanovllm.models.families import FAMILIES, family_of, supported_architecture

if TYPE_CHECKING:
    from torch import nn

    from nanovllm.models.model_config import ModelConfig

__all__ = ["FAMILIES", "family_of", "model_class", "supported_architecture"]


def model_class(model_config: "ModelConfig") -> "type[nn.Module]":
    """The class that builds the model of `model_config`: the decoder of `blocks` for every family but Gemma 4
    (whose own is `gemma4_decoder`), their differences coming in through `model_config`, with the
    multi-token-prediction layer where it asks for it (`mtp`; imported now, with torch)."""
    if model_config.gemma4 is not None:
        from nanovllm.models.gemma4_decoder import Gemma4ForCausalLM

        return Gemma4ForCausalLM
    if model_config.with_mtp:
        from nanovllm.models.mtp import DecoderWithMTP

        return DecoderWithMTP
    from nanovllm.models.blocks import DecoderForCausalLM

    return DecoderForCausalLM
