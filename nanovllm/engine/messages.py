"""What crosses between an engine client and the engine core: token ids and counts, never text."""

from dataclasses import dataclass

from nanovllm.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    """A checked request for one completion: prompt token ids and the sampling settings (the core reads
    the token-level ones; `max_tokens` is set)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


@dataclass
class TokenLogprobs:
    """Log-probabilities at one position, from the raw logits: the chosen (or, for a prompt, the
    actual) token first, then the top alternatives in order; `rank` is the first token's rank among
    the whole vocabulary (1 = the most likely)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


@dataclass
class EngineCoreOutput:
    """What one step added to one request.

    `finish_reason` is "stop" (a stop or end-of-sequence token, the last of
    `new_token_ids`; `stop_reason` is that token when it is one of the
    request's stop_token_ids), "length" (max_tokens or max_model_len), "error"
    (a step failed and the core dropped the request) or None while the request
    goes on. `new_logprobs` has one entry per new token when the request asked
    for logprobs; `new_prompt_logprobs` one per prompt position the step
    scored, when it asked for prompt logprobs (a prompt chunk may bring those
    without a new token).
    """

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    num_cached_tokens: int = 0
    new_prompt_logprobs: list[TokenLogprobs] | None = None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the core's load, and counters since start-up: prompt tokens looked up in the
    prefix cache and those it held, and preemptions."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0


@dataclass(frozen=True)
class EngineCoreInfo:
    """What the core found at start-up, for the front end's checks of each request."""

    num_kvcache_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
