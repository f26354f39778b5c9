"""What crosses between an engine client and the engine core: token ids and counts, never text."""

from dataclasses import dataclass

from nanovllm.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    """A checked request: prompt token ids and the sampling settings (the core reads the token-level ones)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


@dataclass
class EngineCoreOutput:
    """What one step added to one request.

    `finish_reason` is "stop" (a stop or end-of-sequence token, the last of
    `new_token_ids`), "length" (max_tokens or max_model_len) or None while the
    request goes on. `new_logprobs` has one {token id: logprob} dict per new
    token when the request asked for logprobs.
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None
    num_cached_tokens: int = 0


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the core's load."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0


@dataclass(frozen=True)
class EngineCoreInfo:
    """What the core found at start-up, for the front end's checks of each request."""

    num_kvcache_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
