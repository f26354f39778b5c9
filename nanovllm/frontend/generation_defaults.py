"""The sampling values that a model's generation_config.json recommends, as defaults for requests."""

import json
import os

from nanovllm.config import Config
from nanovllm.sampling_params import SamplingParams

# the generation_config.json keys that become request defaults, with the same names in SamplingParams
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_config_path(config: Config) -> str | None:
    """The generation_config.json whose sampling values are the defaults; None when there is none to read."""
    if config.generation_config == "vllm":
        return None
    folder = config.model if config.generation_config == "auto" else config.generation_config
    path = os.path.join(folder, "generation_config.json")
    return path if os.path.isfile(path) else None


def generation_defaults(config: Config) -> dict[str, float | int]:
    """The sampling values of the model's generation config (`config.generation_config`), {} if none; a
    ValueError names the file when they are not valid sampling settings."""
    path = generation_config_path(config)
    if path is None:
        return {}
    try:
        with open(path) as f:
            values = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix it, or pass generation_config='vllm'") from None
    defaults = {key: values[key] for key in SAMPLING_KEYS if values.get(key) is not None}
    try:
        SamplingParams(**defaults)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path} recommends invalid sampling values: {e}; pass generation_config='vllm'") from None
    return defaults
