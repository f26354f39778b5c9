"""Method "mtp" checked against the target model: its family drafts with a multi-token-prediction layer, its
config declares one, and its checkpoint holds the layer's weights (`mtp.*`).

Reads the checkpoint's safetensors headers alone (JSON after an 8-byte length), so that it imports no torch.
"""

import glob
import json
import os
import struct
from dataclasses import replace

from nanovllm.models.model_config import ModelConfig

_MTP_PREFIX = "mtp."


def with_mtp(model_config: ModelConfig, model_dir: str, load_format: str, tensor_parallel_size: int) -> ModelConfig:
    """`model_config` that builds its multi-token-prediction layer; ValueError naming method 'mtp' for a model
    family without one, a config that declares none or more than one, a checkpoint without its `mtp.` weights,
    or several ranks."""
    architecture = model_config.architecture
    layers = model_config.mtp_num_hidden_layers
    if layers == 0:
        raise ValueError(
            f"speculative_config method 'mtp' drafts with the model's multi-token-prediction layer, which "
            f"{architecture} models do not have (Qwen3.5, Qwen3.5-MoE and Qwen3-Next checkpoints do); use method "
            f"'ngram' or 'draft_model'"
        )
    if layers != 1:
        raise ValueError(
            f"speculative_config method 'mtp' runs one multi-token-prediction layer; the config of {model_dir!r} "
            f"declares mtp_num_hidden_layers={layers}"
        )
    if tensor_parallel_size > 1:
        raise ValueError(
            "speculative_config method 'mtp' runs with tensor_parallel_size=1 only (for now); lower "
            "tensor_parallel_size or use method 'ngram'"
        )
    if load_format != "dummy" and not any(name.startswith(_MTP_PREFIX) for name in _checkpoint_tensor_names(model_dir)):
        raise ValueError(
            f"speculative_config method 'mtp' needs the multi-token-prediction weights ('{_MTP_PREFIX}*' tensors), "
            f"which the checkpoint in {model_dir!r} does not hold; use a checkpoint that ships them, or method "
            f"'ngram' or 'draft_model'"
        )
    return replace(model_config, with_mtp=True)


def _checkpoint_tensor_names(model_dir: str) -> list[str]:
    """The names of the tensors in the folder's `*.safetensors` files, from their headers."""
    names = []
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            names += [name for name in json.loads(f.read(length)) if name != "__metadata__"]
    return names
