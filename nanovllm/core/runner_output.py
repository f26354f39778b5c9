"""What the model runner gives back for one step, as plain values the scheduler folds in."""

from dataclasses import dataclass, field

from nanovllm.engine.messages import TokenLogprobs


@dataclass
class ModelRunnerOutput:
    """Per request that sampled, in batch order: its new token ids (one; with drafts, the drafts it kept and
    the token sampled after them) and, where asked for, their logprobs, one per token; per request that
    scored prompt positions, their logprobs in position order. With speculative method "mtp", per request
    that sampled, the multi-token-prediction layer's drafts after its last new token (None otherwise)."""

    sampled_token_ids: list[list[int]]
    logprobs: list[list[TokenLogprobs] | None] | None = None
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
    draft_token_ids: list[list[int]] | None = None
