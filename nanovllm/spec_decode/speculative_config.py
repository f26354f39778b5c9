"""The `speculative_config` dict, with vLLM's key names, checked once into a SpeculativeConfig.

Imports nothing heavy: the command line builds its flags from `Config` without torch.
"""

import os
from dataclasses import dataclass

_METHODS = ("ngram", "draft_model", "mtp")
_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size")
_LOOKUP_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
# vLLM's n-gram size when neither bound is given
_DEFAULT_LOOKUP = 5
# queries a verify step may hold (k + 1 per request, padded) while its products are still bound by reading the
# weights rather than by arithmetic (an H100 does about 295 bf16 FLOPs per byte it reads): the default batch
# size above which requests stop drafting
_MEMORY_BOUND_QUERIES = 256


def _positive_int(settings: dict, key: str) -> int | None:
    """`settings[key]` as an integer >= 1 (None when absent); ValueError for anything else."""
    value = settings.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"speculative_config {key!r} must be an integer >= 1, got {value!r}")
    return value


def _draft_model(settings: dict) -> str:
    """The draft model's folder, `settings['model']`, as a string; ValueError when it is missing or not a path
    (whether the folder holds a model is checked where it is loaded)."""
    model = settings.get("model")
    if not isinstance(model, (str, os.PathLike)) or not os.fspath(model):
        raise ValueError(
            f"speculative_config method 'draft_model' needs 'model', the local folder of a smaller model with "
            f"the target's tokenizer, got {model!r}"
        )
    return os.fspath(model)


@dataclass(frozen=True)
class SpeculativeConfig:
    """How requests speculate; the target model checks each step's proposals in one forward pass.

    Method "ngram" proposes, for each request, the `num_speculative_tokens`
    tokens that followed the latest earlier occurrence of its last n tokens (n
    from `prompt_lookup_max` down to `prompt_lookup_min`) in its prompt and
    completion. Method "draft_model" proposes the `num_speculative_tokens`
    tokens that the model in folder `model` (smaller, with the target's
    vocabulary) decodes greedily after them. Method "mtp" proposes the tokens
    that the target checkpoint's own multi-token-prediction layer decodes
    greedily from the target's hidden states (`models/mtp.py`). Each method
    leaves the others' fields None. With more than `disable_by_batch_size` requests running,
    none drafts (`drafting_batch_limit` gives the default).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None
    disable_by_batch_size: int | None = None

    @property
    def drafting_batch_limit(self) -> int:
        """The most running requests at which requests draft: `disable_by_batch_size`, by default as many as
        keep a verify step's padded queries (k + 1 a request) within what reading the weights bounds; beyond
        it, drafts that are rejected cost a step as much compute as tokens."""
        if self.disable_by_batch_size is not None:
            return self.disable_by_batch_size
        return max(1, _MEMORY_BOUND_QUERIES // (self.num_speculative_tokens + 1))

    @classmethod
    def from_dict(cls, settings: dict) -> "SpeculativeConfig":
        """Read vLLM's keys; ValueError that says what to change for an unknown key or a bad value.
        For "ngram", either lookup bound alone sets both; neither gives 5."""
        if not isinstance(settings, dict):
            raise ValueError(
                f"speculative_config must be a dict such as {{'method': 'ngram', 'num_speculative_tokens': 3}}, "
                f"got {settings!r}"
            )
        unknown = sorted(set(settings) - set(_KEYS))
        if unknown:
            raise ValueError(
                f"speculative_config has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"valid ones are: {', '.join(_KEYS)}"
            )
        method = settings.get("method")
        if method not in _METHODS:
            raise ValueError(f"speculative_config 'method' must be one of {', '.join(_METHODS)}, got {method!r}")
        num_tokens = _positive_int(settings, "num_speculative_tokens")
        if num_tokens is None:
            raise ValueError("speculative_config needs 'num_speculative_tokens', the tokens proposed per step (>= 1)")
        batch_limit = _positive_int(settings, "disable_by_batch_size")
        if method == "mtp":
            given = [key for key in ("model", *_LOOKUP_KEYS) if key in settings]
            if given:
                raise ValueError(
                    f"speculative_config method 'mtp' drafts with the target model's own layer and takes no "
                    f"{', '.join(map(repr, given))}"
                )
            return cls(method, num_tokens, disable_by_batch_size=batch_limit)
        if method == "draft_model":
            lookup = [key for key in _LOOKUP_KEYS if key in settings]
            if lookup:
                raise ValueError(
                    f"speculative_config {', '.join(map(repr, lookup))} sets the n-gram lookup, which method "
                    f"'draft_model' does not take"
                )
            return cls(method, num_tokens, model=_draft_model(settings), disable_by_batch_size=batch_limit)
        if "model" in settings:
            raise ValueError("speculative_config 'model' names a draft model, which method 'ngram' does not take")
        low, high = _positive_int(settings, "prompt_lookup_min"), _positive_int(settings, "prompt_lookup_max")
        low, high = low or high or _DEFAULT_LOOKUP, high or low or _DEFAULT_LOOKUP
        if low > high:
            raise ValueError(
                f"speculative_config 'prompt_lookup_min' ({low}) must not exceed 'prompt_lookup_max' ({high})"
            )
        return cls(method, num_tokens, low, high, disable_by_batch_size=batch_limit)
