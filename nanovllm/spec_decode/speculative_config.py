"""The `speculative_config` dict, with vLLM's key names, checked once into a SpeculativeConfig.

Imports nothing heavy: the command line builds its flags from `Config` without torch.
"""

from dataclasses import dataclass

_METHODS = ("ngram", "draft_model")
_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
# vLLM's n-gram size when neither bound is given
_DEFAULT_LOOKUP = 5


def _positive_int(settings: dict, key: str) -> int | None:
    """`settings[key]` as an integer >= 1 (None when absent); ValueError for anything else."""
    value = settings.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"speculative_config {key!r} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """How requests speculate: `method` "ngram" proposes, for each request, the
    `num_speculative_tokens` tokens that followed the latest earlier occurrence
    of its last n tokens (n from `prompt_lookup_max` down to `prompt_lookup_min`)
    in its prompt and completion; the target model checks them all in one step."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @classmethod
    def from_dict(cls, settings: dict) -> "SpeculativeConfig":
        """Read vLLM's keys; ValueError that says what to change for an unknown key or a bad value.
        Either lookup bound alone sets both; neither gives 5."""
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
        if method == "draft_model":
            raise ValueError(
                "speculative_config method 'draft_model' is not supported yet; use {'method': 'ngram', ...}"
            )
        if "model" in settings:
            raise ValueError("speculative_config 'model' names a draft model, which method 'ngram' does not take")
        num_tokens = _positive_int(settings, "num_speculative_tokens")
        if num_tokens is None:
            raise ValueError("speculative_config needs 'num_speculative_tokens', the tokens proposed per step (>= 1)")
        low, high = _positive_int(settings, "prompt_lookup_min"), _positive_int(settings, "prompt_lookup_max")
        low, high = low or high or _DEFAULT_LOOKUP, high or low or _DEFAULT_LOOKUP
        if low > high:
            raise ValueError(
                f"speculative_config 'prompt_lookup_min' ({low}) must not exceed 'prompt_lookup_max' ({high})"
            )
        return cls(method, num_tokens, low, high)
