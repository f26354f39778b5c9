"""What crosses between an engine client and the engine core: token ids and counts, never text.

The messages are msgspec structs, so that the core in a process of its own
receives and sends them as compact msgpack; in one process they are passed as
they are.
"""

import msgspec

from nanovllm.sampling_params import SamplingParams
from nanovllm.worker.start_up_report import StartUpReport


class EngineCoreRequest(msgspec.Struct, tag="add"):
    """A checked request for one completion: prompt token ids and the sampling settings (the core reads
    the token-level ones; `max_tokens` is set)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


class EngineCoreAbort(msgspec.Struct, tag="abort"):
    """Drop these requests (finished or unknown ids are ignored)."""

    request_ids: list[str]


class EngineCoreShutdown(msgspec.Struct, tag="shutdown"):
    """Stop the core: its loop ends and it releases the device."""


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Log-probabilities at one position, from the raw logits: the chosen (or, for a prompt, the
    actual) token first, then the top alternatives in order; `rank` is the first token's rank among
    the whole vocabulary (1 = the most likely)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


class EngineCoreOutput(msgspec.Struct, array_like=True):
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


class EngineStats(msgspec.Struct, frozen=True):
    """A snapshot of the core's load, and counters since start-up: prompt tokens looked up in the
    prefix cache and those it held, preemptions, and with speculative decoding the request-steps that
    checked drafts, the drafts checked, those kept, and those kept at each draft position (the first
    draft of a step, the second ...). `num_waiting` counts the requests the core holds but has not
    scheduled yet."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    spec_decode_num_drafts: int = 0
    spec_decode_num_draft_tokens: int = 0
    spec_decode_num_accepted_tokens: int = 0
    spec_decode_num_accepted_tokens_per_pos: list[int] = msgspec.field(default_factory=list)


class KVGroupCapacity(msgspec.Struct, frozen=True):
    """One cache group's share of the KV cache when every sequence is max_model_len long: `kind` ("full
    attention", "sliding window 1024"), its layers, and the tokens of K/V it then holds over all
    sequences."""

    kind: str
    num_layers: int
    tokens: int


class EngineCoreInfo(msgspec.Struct, frozen=True):
    """What the core found at start-up, for the front end's checks of each request and its start-up log;
    `kv_cache_dtype` is the element type the KV cache was given, as vLLM names it (`KVCacheSpec.dtype_name`:
    "bfloat16" ...), and `start_up` what the model runner measured while starting. `max_concurrency` is the
    number of max_model_len-long sequences the cache holds at once, `kv_groups` what each cache group then
    holds, and `max_request_tokens` the longest request (prompt and completion) the cache can hold alone.
    `num_state_slots` is the number of recurrent-state slots (0: the model has no recurrent layers)."""

    num_kvcache_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    kv_cache_dtype: str
    start_up: StartUpReport
    max_concurrency: float
    kv_groups: list[KVGroupCapacity]
    max_request_tokens: int
    num_state_slots: int


class EngineCoreOutputs(msgspec.Struct, tag="outputs"):
    """One step's outputs (possibly none) and the core's load after it."""

    outputs: list[EngineCoreOutput]
    stats: EngineStats


class EngineCoreReady(msgspec.Struct, tag="ready"):
    """The core has started and takes requests."""

    info: EngineCoreInfo


class EngineCoreFailed(msgspec.Struct, tag="failed"):
    """The core could not start, or it failed (a step, or a tensor-parallel worker) and is exiting;
    `message` says why."""

    message: str


# what a client sends to a core process, and what it gets back
ClientMessage = EngineCoreRequest | EngineCoreAbort | EngineCoreShutdown
CoreMessage = EngineCoreOutputs | EngineCoreReady | EngineCoreFailed
