"""One rank's model: built on its device in the config's dtype, its share of the weights loaded (or made up),
FP8 where the config asks for it."""

import functools
from itertools import chain

import torch

from nanovllm.config import Config
from nanovllm.layers.fp8_linear import dequantize_tensor, quantize_weights, store_fp8_weights
from nanovllm.models import model_class
from nanovllm.utils.loader import load_dummy_weights, load_model
from nanovllm.utils.parallel import tensor_parallel


def build_model(config: Config, device: torch.device, rank: int, world_size: int) -> torch.nn.Module:
    """The model of `config.model_config`, rank `rank`'s share of it, with its weights, in eval mode and
    without gradients."""
    model = _empty_model(config, device, rank, world_size)
    fp8 = config.fp8_weights
    # an FP8 checkpoint loads into FP8 layers; anything else is quantized once loaded (dummy weights of an
    # FP8 checkpoint in its own layout)
    fp8_checkpoint = config.model_config.weight_quantization is not None and config.load_format != "dummy"
    if fp8_checkpoint:
        store_fp8_weights(model, fp8.block)
    if config.load_format == "dummy":
        load_dummy_weights(model, config.model_config, config.seed)
    else:
        load_model(model, config.model, functools.partial(dequantize_tensor, block=fp8 and fp8.block))
    if fp8 is not None and not fp8_checkpoint:
        quantize_weights(model, fp8.block)
    return model.eval().requires_grad_(False)


def tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (each tensor once, however many modules hold it)."""
    return sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))


def _empty_model(config: Config, device: torch.device, rank: int, world_size: int) -> torch.nn.Module:
    """The model's modules on `device` in the config's dtype, their weights not loaded."""
    model_config = config.model_config
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(config.torch_dtype)
    try:
        with device, tensor_parallel(rank, world_size):
            return model_class(model_config)(model_config)
    finally:
        torch.set_default_dtype(default_dtype)
