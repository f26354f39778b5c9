"""From a user's prompt and sampling params to a checked prompt and settings for the engine core."""

from dataclasses import dataclass, replace

from transformers import PreTrainedTokenizerBase

from nanovllm.core.structured_output import grammar_of
from nanovllm.engine.messages import EngineCoreInfo
from nanovllm.sampling_params import SamplingParams

# text, token ids, {"prompt": text} or {"prompt_token_ids": ids}
Prompt = str | list[int] | dict

# Keys of vLLM's prompt dicts for features a text-only engine lacks: taken only when None.
_ABSENT_PROMPT_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids", "cache_salt")


@dataclass
class ProcessedPrompt:
    """A prompt as token ids, with its text when it was given as text."""

    text: str | None
    token_ids: list[int]


def _is_token_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def is_single_prompt(prompts) -> bool:
    """Whether `prompts` is one prompt rather than a list of them (a list of ints is one prompt of ids)."""
    return isinstance(prompts, (str, dict)) or (_is_token_ids(prompts) and len(prompts) > 0)


def _most_characters(tokenizer: PreTrainedTokenizerBase, max_model_len: int) -> int:
    """A length in characters beyond which a text cannot fit in `max_model_len` tokens, so that an
    over-long prompt is refused before it is tokenized: every token stands for at most as many
    characters as its vocabulary entry has (byte-level entries: one per byte), times 4 for the
    characters a normalizer may merge into one (NFC composes at most 3)."""
    longest = max(len(entry) for entry in tokenizer.get_vocab())
    return 4 * longest * max_model_len


class InputProcessor:
    """Tokenizes prompts and refuses, with a message that says what to change, any request the
    engine could not serve: bad token ids, an empty or over-long prompt, text that is not valid
    Unicode, settings beyond the vocabulary or the context, more KV blocks than the cache holds."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase | None, info: EngineCoreInfo):
        self.tokenizer = tokenizer
        self.info = info
        self.max_prompt_chars = None if tokenizer is None else _most_characters(tokenizer, info.max_model_len)

    def parse(self, prompt: Prompt) -> ProcessedPrompt:
        """The prompt's token ids (and text), checked against the vocabulary."""
        if isinstance(prompt, dict):
            prompt = self._unpack(prompt)
        if isinstance(prompt, str):
            return ProcessedPrompt(prompt, self.tokenize(prompt))
        if _is_token_ids(prompt):
            return ProcessedPrompt(None, self.check_token_ids(list(prompt)))
        raise ValueError(
            f"a prompt must be text, a list of token ids, or a dict with 'prompt' or "
            f"'prompt_token_ids', got {type(prompt).__name__}"
        )

    @staticmethod
    def _unpack(prompt: dict) -> str | list[int]:
        """The text of {"prompt": text} or the ids of {"prompt_token_ids": ids}; vLLM's other keys
        (multi_modal_data ...) are accepted when None."""
        if prompt.get("multi_modal_data") is not None:
            raise ValueError(
                "multi_modal_data is not supported: this is a text-only model; send the prompt as "
                "text or token ids only (multi_modal_data None or left out)"
            )
        for key in _ABSENT_PROMPT_KEYS:
            if prompt.get(key) is not None:
                raise ValueError(f"{key} is not supported by this text-only engine; leave it out or set it to None")
        prompt = {key: value for key, value in prompt.items() if key not in _ABSENT_PROMPT_KEYS}
        if set(prompt) == {"prompt"} and isinstance(prompt["prompt"], str):
            return prompt["prompt"]
        if set(prompt) == {"prompt_token_ids"} and _is_token_ids(prompt["prompt_token_ids"]):
            return list(prompt["prompt_token_ids"])
        raise ValueError(
            f"a prompt dict takes exactly one key: 'prompt' (text) or 'prompt_token_ids' (a list "
            f"of token ids), got {sorted(prompt)} with {[type(v).__name__ for v in prompt.values()]}"
        )

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a text prompt (a rendered chat template holds its special tokens already:
        `add_special_tokens=False`)."""
        if self.tokenizer is None:
            raise ValueError("skip_tokenizer_init=True: prompts must be lists of token ids, not text")
        if len(text) > self.max_prompt_chars:
            raise ValueError(
                f"the prompt is {len(text)} characters long; no {self.max_prompt_chars}-character text "
                f"fits in this model's context of {self.info.max_model_len} tokens; shorten the prompt"
            )
        check_unicode(text, "the prompt")
        return self.check_token_ids(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def check_token_ids(self, token_ids: list[int]) -> list[int]:
        """`token_ids`, once checked to be a non-empty list of ids inside the vocabulary."""
        vocab_size = self.info.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
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
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or ())):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise ValueError(f"{name} names token ids {bad[:5]} outside the vocabulary [0, {vocab_size})")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > vocab_size:
                raise ValueError(f"{name}={value} asks for more alternatives than the vocabulary's {vocab_size} tokens")
        if params.structured_outputs is not None:
            if self.tokenizer is None:
                raise ValueError("structured outputs need a tokenizer, but skip_tokenizer_init=True")
            grammar_of(params.structured_outputs)  # a bad schema, regex or grammar is refused here

    def check_fits(self, token_ids: list[int], params: SamplingParams) -> None:
        """Refuse up front a request that could never finish within the model or the KV cache."""
        info = self.info
        if len(token_ids) >= info.max_model_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but max_model_len is {info.max_model_len}, which "
                f"leaves no room for a completion; shorten the prompt or raise max_model_len"
            )
        final_len = min(len(token_ids) + params.max_tokens, info.max_model_len)
        if final_len > info.max_request_tokens:
            raise ValueError(
                f"the request may reach {final_len} tokens but the KV cache ({info.num_kvcache_blocks} blocks of "
                f"{info.block_size} tokens) holds at most {info.max_request_tokens} for one request; lower "
                f"max_tokens or give the KV cache more memory (num_kvcache_blocks, cpu_kvcache_gb or "
                f"gpu_memory_utilization)"
            )

    def _whole_vocabulary(self, params: SamplingParams) -> SamplingParams:
        """`params` with logprobs and prompt_logprobs of -1 replaced by the vocabulary's size."""
        whole = {name: self.info.vocab_size for name in ("logprobs", "prompt_logprobs") if getattr(params, name) == -1}
        return replace(params, **whole) if whole else params

    def process(
        self, prompt: Prompt | ProcessedPrompt, params: SamplingParams
    ) -> tuple[ProcessedPrompt, SamplingParams]:
        """The checked prompt and its settings, `max_tokens` filled in where it was None (as many as the
        context holds) and logprobs of -1 as the vocabulary's size; ValueError if the request cannot be
        served."""
        self.check_params(params)
        params = self._whole_vocabulary(params)
        processed = prompt if isinstance(prompt, ProcessedPrompt) else self.parse(prompt)
        if params.max_tokens is None:
            room = self.info.max_model_len - len(processed.token_ids)
            params = replace(params, max_tokens=max(room, 1))
        self.check_fits(processed.token_ids, params)
        return processed, params


def check_unicode(text: str, what: str) -> None:
    """Refuse text that UTF-8 cannot encode (a lone surrogate such as '\\ud800'), naming where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} is not valid Unicode: {text[e.start : e.end]!r} at character {e.start} is a lone "
            f"surrogate; send proper UTF-8 text"
        ) from None
