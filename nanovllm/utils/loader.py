"""Loads a Hugging Face safetensors checkpoint into a model, parameter by parameter."""

import glob
import os

import torch
from safetensors import safe_open
from torch import nn

# Checkpoint tensors that hold nothing the engine needs.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole, unsharded tensor."""
    param.data.copy_(loaded)


def _target(model: nn.Module, name: str) -> tuple[str, object]:
    """Our parameter name and shard id for checkpoint tensor `name`."""
    for checkpoint_part, (fused_part, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{fused_part}."), shard_id
    return name, None


def load_model(model: nn.Module, path: str) -> None:
    """Copy every tensor of every `*.safetensors` file in `path` into `model`.

    Raises FileNotFoundError when there are no weight files and ValueError when
    the checkpoint lacks a parameter the model needs or holds one it does not know.
    """
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weight files in {path!r}")
    params = dict(model.named_parameters())
    tied = getattr(model, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                param_name, shard_id = _target(model, name)
                if param_name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} in {os.path.basename(file)} matches no model parameter")
                param = params[param_name]
                tensor = f.get_tensor(name)
                if shard_id is None:
                    getattr(param, "weight_loader", default_weight_loader)(param, tensor)
                else:
                    param.weight_loader(param, tensor, shard_id)
                loaded.add(f"{param_name}:{shard_id}")
    _check_complete(model, params, loaded, path)


def _check_complete(model: nn.Module, params: dict, loaded: set[str], path: str) -> None:
    expected_shards: dict[str, list] = {}
    for checkpoint_part, (fused_part, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        expected_shards.setdefault(fused_part, []).append(shard_id)
    missing = []
    for name in params:
        module_part = name.split(".")[-2] if "." in name else name
        shard_ids = expected_shards.get(module_part, [None])
        missing += [f"{name}[{s}]" if s is not None else name for s in shard_ids if f"{name}:{s}" not in loaded]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint in {path!r} is missing weights: {shown}")


def init_dummy_weights(model: nn.Module, low: float = -1e-3, high: float = 1e-3) -> None:
    """Fill every parameter with small random values (for benchmarks without a checkpoint)."""
    with torch.no_grad():
        for param in model.parameters():
            param.uniform_(low, high)
