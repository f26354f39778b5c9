"""What the model runner gives back for one step, as plain values the scheduler folds in."""

from dataclasses import dataclass, field

from nanovllm.engine.messages import TokenLogprobs


@dataclass
class ModelRunnerOutput:
    """Per request that sampled, in batch order: its new token id and, where asked for, its logprobs;
    per request that scored prompt positions, their logprobs in position order."""

    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None = None
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)
