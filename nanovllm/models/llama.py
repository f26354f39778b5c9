"""Llama (Llama 2 and 3, SmolLM2): the plain pre-norm decoder of `blocks`, with the defaults of transformers'
LlamaConfig; Llama 3.1's rope scaling comes in through the config's rope parameters."""

from nanovllm.models.family_spec import FamilySpec, HFDefaults

LLAMA = FamilySpec(HFDefaults())
