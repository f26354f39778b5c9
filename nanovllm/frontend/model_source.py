"""Where a model's files are: a local folder as it is, or a Hugging Face Hub id resolved to a folder.

An id such as "Qwen/Qwen3-0.6B" is resolved through `huggingface_hub`: its
config, tokenizer and safetensors files are downloaded into the Hugging Face
cache where the Hub can be reached, and read from that cache where it cannot
(no network, or HF_HUB_OFFLINE=1). The front end resolves the model once, so
that the tokenizer and the engine core read the same folder.
"""

import os

# what the engine reads of a checkpoint: config and generation config, tokenizer files, weights
_MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken")


def resolve_model(model: str) -> str:
    """The local folder of `model`: `model` itself where it is a folder, else the folder of the Hugging Face
    Hub model of that id; FileNotFoundError, saying what to do, when it is neither. Anything that is not a
    string or a path is returned as it is, for the config's check to name."""
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str) or os.path.isdir(model):
        return model
    if not _is_hub_id(model):
        raise FileNotFoundError(
            f"model folder {model!r} does not exist; pass a local Hugging Face model folder or a Hugging Face "
            f"Hub model id such as Qwen/Qwen3-0.6B"
        )
    return _hub_folder(model)


def _is_hub_id(model: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return False
    return True


def _hub_folder(model_id: str) -> str:
    """The snapshot folder of `model_id` in the Hugging Face cache, downloaded first where the Hub answers."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    not_here = f"{model_id!r} is not a local folder"
    try:
        return snapshot_download(model_id, allow_patterns=list(_MODEL_FILES))
    except GatedRepoError as e:
        raise FileNotFoundError(
            f"{not_here}, and the Hugging Face Hub model of that id is gated: accept its terms at "
            f"https://huggingface.co/{model_id} and log in (`hf auth login`, or set HF_TOKEN)"
        ) from e
    except RepositoryNotFoundError as e:
        raise FileNotFoundError(
            f"{model_id!r} is neither a local folder nor a model on the Hugging Face Hub; check the name "
            f"(a private model needs `hf auth login`, or HF_TOKEN)"
        ) from e
    except LocalEntryNotFoundError as e:
        why = "offline mode is on (HF_HUB_OFFLINE)" if constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        # also where the cache holds only part of the model (an interrupted download)
        raise FileNotFoundError(
            f"{not_here}, and the Hugging Face cache ({constants.HF_HUB_CACHE}) does not hold the Hub model of "
            f"that id, which cannot be downloaded now: {why}; run `hf download {model_id}` where there is a "
            f"network (into this cache: HF_HUB_CACHE), or pass a local model folder"
        ) from e
    except HfHubHTTPError as e:
        raise FileNotFoundError(f"{not_here}, and the Hugging Face Hub refused {model_id!r}: {e}") from e
