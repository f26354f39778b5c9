"""From a user's prompt and sampling params to a checked request for the engine core."""

from transformers import PreTrainedTokenizerBase

from nanovllm.engine.messages import EngineCoreInfo, EngineCoreRequest
from nanovllm.sampling_params import SamplingParams

Prompt = str | list[int]


class InputProcessor:
    """Tokenizes prompts and refuses, with a message that says what to change, any request the
    engine could not serve: bad token ids, an empty or over-long prompt, settings beyond the
    vocabulary, more KV blocks than the cache holds."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, info: EngineCoreInfo):
        self.tokenizer = tokenizer
        self.info = info

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt given as text or as ids, checked against the vocabulary."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("skip_tokenizer_init=True: prompts must be lists of token ids, not text")
            token_ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            token_ids = list(prompt)
            vocab_size = self.info.vocab_size
            bad = [t for t in token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        else:
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise ValueError("the prompt is empty; give at least one token")
        return token_ids

    def check_params(self, params: SamplingParams) -> None:
        """Refuse settings that need a missing tokenizer or name tokens outside the vocabulary."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, but skip_tokenizer_init=True; use stop_token_ids")
        vocab_size = self.info.vocab_size
        bad = [t for t in params.stop_token_ids if t >= vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
        if params.logprobs is not None and params.logprobs > vocab_size:
            raise ValueError(f"logprobs={params.logprobs} asks for more alternatives than the "
                             f"vocabulary's {vocab_size} tokens")

    def check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        """Refuse up front a request that could never finish within the model or the KV cache."""
        info = self.info
        if len(token_ids) > info.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but max_model_len is {info.max_model_len}; "
                f"shorten the prompt or raise max_model_len"
            )
        final_len = min(len(token_ids) + params.max_tokens, info.max_model_len)
        blocks = (final_len + info.block_size - 1) // info.block_size
        if blocks > info.num_kvcache_blocks:
            raise ValueError(
                f"the request needs {blocks} KV-cache blocks ({final_len} tokens) but the cache holds only "
                f"{info.num_kvcache_blocks}; lower max_tokens or give the KV cache more memory "
                f"(num_kvcache_blocks, cpu_kvcache_gb or gpu_memory_utilization)"
            )

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams) -> EngineCoreRequest:
        """A checked request; ValueError if it cannot be served."""
        self.check_params(params)
        token_ids = self.tokenize(prompt)
        self.check_fits(token_ids, params)
        return EngineCoreRequest(request_id, token_ids, params)
