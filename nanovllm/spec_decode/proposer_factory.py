"""The proposer of the configured speculative method (`Config.speculative`)."""

from typing import TYPE_CHECKING

from nanovllm.spec_decode.mtp_proposer import MTPProposer
from nanovllm.spec_decode.ngram_proposer import NgramProposer
from nanovllm.spec_decode.proposer import Proposer

if TYPE_CHECKING:
    from nanovllm.config import Config


def make_proposer(config: "Config", num_kvcache_blocks: int) -> Proposer | None:
    """The proposer of the configured method; None without speculation. A draft model gets a KV cache of
    `num_kvcache_blocks` blocks, as many as the target's."""
    spec = config.speculative
    if spec is None:
        return None
    if spec.method == "draft_model":
        # the draft model's runner imports torch, which the engine package loads only once a core starts
        from nanovllm.spec_decode.draft_model_proposer import DraftModelProposer

        return DraftModelProposer(config, num_kvcache_blocks)
    if spec.method == "mtp":  # the target's runner drafts beside each step
        return MTPProposer(spec.num_speculative_tokens)
    return NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
