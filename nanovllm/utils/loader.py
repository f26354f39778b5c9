"""Loads a Hugging Face safetensors checkpoint into a model, each rank reading only its slices.

A parameter's loader gets the checkpoint tensor as something it can slice: a
safetensors slice (only the indexed part is read from disk), a `RandomTensor`
for dummy weights, or a plain tensor.

FP8 checkpoints: a float8 weight loads as it is into an FP8 layer, with its
scales (`weight_scale`, or `weight_scale_inv`, which names the same multiplier);
one that loads into a full-precision parameter (an FP8 LM head or embedding) is
dequantized whole first, by the caller's `dequantize`.
"""

import glob
import os
import re
import zlib
from collections.abc import Callable

import torch
from safetensors import safe_open
from torch import nn

from nanovllm.utils.parallel import tensor_parallel

# Checkpoint tensors that hold nothing the engine needs: static FP8 activation scales too, as activations
# are quantized per token at run time
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".input_scale")
_FP8_SAFETENSORS_DTYPE = "F8_E4M3"
# a float8 weight's scales, as checkpoints name them
_SCALE_SUFFIXES = ("_scale_inv", "_scale")
# A mixture-of-experts layer's expert tensor: one expert's (`experts.3.gate_proj.weight`) or every
# expert's stacked (`experts.gate_up_proj`)
_EXPERT_TENSOR = re.compile(r"\.experts\.(?:(?P<expert>\d+)\.(?P<part>\w+)\.weight|(?P<stacked>\w+))$")


def shard(loaded, dim: int, start: int, size: int) -> torch.Tensor:
    """`size` entries of `loaded` from `start` along `dim`, reading nothing else."""
    return loaded[(slice(None),) * dim + (slice(start, start + size),)]


def default_weight_loader(param: nn.Parameter, loaded) -> None:
    """Copy a whole, unsharded tensor."""
    param.data.copy_(loaded[:])


def _load_into(param: nn.Parameter, loaded, shard_id) -> None:
    if shard_id is None:
        getattr(param, "weight_loader", default_weight_loader)(param, loaded)
    else:
        param.weight_loader(param, loaded, shard_id)


def _renamed(model: nn.Module, name: str) -> str | None:
    """Checkpoint tensor `name` under our prefix (the model's `checkpoint_prefixes`) and with our module
    names (its `checkpoint_renames`), None for a tensor the model does not load (such as an image-text
    checkpoint's vision tower)."""
    for prefix, ours in getattr(model, "checkpoint_prefixes", {}).items():
        if name.startswith(prefix):
            if ours is None:
                return None
            name = ours + name[len(prefix) :]
            break
    for part, ours in getattr(model, "checkpoint_renames", {}).items():
        name = name.replace(part, ours)
    return name.removesuffix("_inv") if name.endswith(".weight_scale_inv") else name


def _expert_target(model: nn.Module, name: str) -> tuple[str, object] | None:
    """Our stacked expert parameter and shard id for checkpoint tensor `name` (see the model's
    `expert_weights`): shard None for every expert's tensor, (expert, part) for one expert's; None for a
    tensor that is not an expert's."""
    match = _EXPERT_TENSOR.search(name)
    if match is None:
        return None
    if match["stacked"] is not None:
        param, shard_id = getattr(model, "stacked_expert_weights", {}).get(match["stacked"]), None
    else:
        param, part = getattr(model, "expert_weights", {}).get(match["part"], (None, None))
        shard_id = (int(match["expert"]), part)
    return None if param is None else (f"{name[: match.start()]}.experts.{param}", shard_id)


def _target(model: nn.Module, name: str) -> tuple[str, object]:
    """Our parameter name and shard id for checkpoint tensor `name`."""
    expert = _expert_target(model, name)
    if expert is not None:
        return expert
    for checkpoint_part, (fused_part, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        if f".{checkpoint_part}." in name:
            return name.replace(f".{checkpoint_part}.", f".{fused_part}."), shard_id
    return name, None


def load_model(model: nn.Module, path: str, dequantize: Callable | None = None) -> None:
    """Copy every tensor of every `*.safetensors` file in `path` into `model`; `dequantize(weight, scale)`
    gives a float8 tensor and its scales in full precision, for a parameter that is not FP8.

    Raises FileNotFoundError when there are no weight files and ValueError when
    the checkpoint lacks a parameter the model needs or holds one it does not know.
    """
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weight files in {path!r}")
    params = dict(model.named_parameters())
    tied = getattr(model, "tie_word_embeddings", False)
    files_of = _tensor_files(files)
    loaded: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for checkpoint_name in f.keys():
                name = _renamed(model, checkpoint_name)
                if name is None or name.endswith(_IGNORED_SUFFIXES) or (tied and name.startswith("lm_head.weight")):
                    continue
                if name in getattr(model, "unused_checkpoint_tensors", ()):
                    continue  # held by the checkpoint for layers that do not run it (Gemma 4's KV-shared ones)
                param_name, shard_id = _target(model, name)
                if _scales_full_precision_weight(params, param_name):
                    continue  # read with its weight, which is dequantized
                if param_name not in params:
                    raise ValueError(
                        f"checkpoint tensor {checkpoint_name!r} in {os.path.basename(file)} matches no model parameter"
                    )
                tensor = f.get_slice(checkpoint_name)
                if tensor.get_dtype() == _FP8_SAFETENSORS_DTYPE and params[param_name].dtype != torch.float8_e4m3fn:
                    tensor = _dequantized(files_of, checkpoint_name, tensor[:], dequantize)
                _load_into(params[param_name], tensor, shard_id)
                loaded.add(f"{param_name}:{shard_id}")
    _check_complete(model, params, loaded, path)
    finish_loading(model)


def finish_loading(model: nn.Module) -> None:
    """Let the modules that lay their weights out anew once loaded (a `finish_loading` method) do so."""
    for module in list(model.modules()):
        finish = getattr(module, "finish_loading", None)
        if finish is not None:
            finish()


def _tensor_files(files: list[str]) -> dict[str, str]:
    """The file that holds each checkpoint tensor (read from the files' headers only)."""
    files_of = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            files_of.update(dict.fromkeys(f.keys(), file))
    return files_of


def _scales_full_precision_weight(params: dict, param_name: str) -> bool:
    """Whether `param_name` is the scale of a weight that the model holds in full precision."""
    weight = params.get(param_name.removesuffix("_scale")) if param_name.endswith(".weight_scale") else None
    return param_name not in params and weight is not None and weight.dtype != torch.float8_e4m3fn


def _dequantized(files_of: dict, name: str, weight: torch.Tensor, dequantize: Callable | None) -> torch.Tensor:
    """Float8 checkpoint tensor `name` (`weight`) times its scales, for a full-precision parameter."""
    scale_name = next((name + suffix for suffix in _SCALE_SUFFIXES if name + suffix in files_of), None)
    if scale_name is None or dequantize is None:
        raise ValueError(
            f"checkpoint tensor {name!r} is float8 but "
            + ("has no scales beside it" if scale_name is None else "config.json has no quantization_config")
        )
    with safe_open(files_of[scale_name], framework="pt", device="cpu") as f:
        return dequantize(weight, f.get_tensor(scale_name))


def _check_complete(model: nn.Module, params: dict, loaded: set[str], path: str) -> None:
    """ValueError naming the parameters (or their shards) no checkpoint tensor filled. A fused parameter is
    filled by one tensor per shard (its `shard_ids`, or the model's `packed_modules_mapping`), or by one
    tensor that holds every shard."""
    expected_shards: dict[str, list] = {}
    for checkpoint_part, (fused_part, shard_id) in getattr(model, "packed_modules_mapping", {}).items():
        expected_shards.setdefault(fused_part, []).append(shard_id)
    missing = []
    for name, param in params.items():
        if f"{name}:None" in loaded:
            continue
        module_part = name.split(".")[-2] if "." in name else name
        shard_ids = getattr(param, "shard_ids", None) or expected_shards.get(module_part, [None])
        missing += [f"{name}[{s}]" if s is not None else name for s in shard_ids if f"{name}:{s}" not in loaded]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"checkpoint in {path!r} is missing weights: {shown}")


class RandomTensor:
    """Stands in for a checkpoint tensor: uniform values drawn from `seed`, whichever slice is read."""

    def __init__(
        self, shape: tuple[int, ...], seed: int, dtype: torch.dtype, device: torch.device, low: float, high: float
    ):
        self.shape, self.seed, self.dtype, self.device = shape, seed, dtype, device
        self.low, self.high = low, high

    def __getitem__(self, index) -> torch.Tensor:
        generator = torch.Generator(self.device).manual_seed(self.seed)
        full = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        if not self.dtype.is_floating_point:  # whole numbers from low up to high, exclusive
            return full.random_(self.low, self.high, generator=generator)[index]
        return full.uniform_(self.low, self.high, generator=generator)[index]


def load_dummy_weights(model: nn.Module, model_config, seed: int = 0, low: float = -1e-3, high: float = 1e-3) -> None:
    """Fill every parameter with small random values (for benchmarks without a checkpoint).

    Every rank cuts its slices from the same full tensors, so a model split over
    N ranks computes what the unsplit one does. `model_config` is the ModelConfig `model` was built from.
    A parameter loaded from a checkpoint tensor of another layout names that tensor's whole shape
    (`checkpoint_shape`), one of whole numbers the range to draw them from (`dummy_range`).
    """
    with torch.device("meta"), tensor_parallel(0, 1):
        whole = type(model)(model_config)
    modules = dict(whole.named_modules())
    whole_params = dict(whole.named_parameters())
    for name, param in model.named_parameters():
        shape = getattr(whole_params[name], "checkpoint_shape", whole_params[name].shape)
        bounds = getattr(whole_params[name], "dummy_range", (low, high))
        module = modules[name.rpartition(".")[0]]
        # a fused parameter is filled from one full tensor per checkpoint part
        for shard_id, rows in getattr(module, "shard_sizes", {None: shape[0]}).items():
            tensor_seed = seed + zlib.crc32(f"{name}:{shard_id}".encode())
            _load_into(
                param, RandomTensor((rows, *shape[1:]), tensor_seed, param.dtype, param.device, *bounds), shard_id
            )
    finish_loading(model)
