"""The model folder's tokenizer, and the token ids that end a completion."""

import json
import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from nanovllm.config import Config

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(config: Config) -> PreTrainedTokenizerBase | None:
    """The folder's tokenizer (None with `skip_tokenizer_init`); FileNotFoundError when it has none."""
    if config.skip_tokenizer_init:
        return None
    model = config.model
    if not any(os.path.isfile(os.path.join(model, name)) for name in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer files ({', '.join(_TOKENIZER_FILES)}) in {model!r}")
    tokenizer = AutoTokenizer.from_pretrained(model)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise ValueError(
            f"the tokenizer in {model!r} has no fast (tokenizers library) version, which "
            f"incremental detokenization needs; add a tokenizer.json to the folder"
        )
    return tokenizer


def _as_ids(value) -> set[int]:
    if value is None:
        return set()
    return {value} if isinstance(value, int) else set(value)


def eos_token_ids(config: Config, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's, the config's and the generation config's."""
    ids = _as_ids(config.model_config.eos_token_id)
    if tokenizer is not None:
        ids |= _as_ids(tokenizer.eos_token_id)
    path = os.path.join(config.model, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            ids |= _as_ids(json.load(f).get("eos_token_id"))
    return tuple(sorted(ids))
