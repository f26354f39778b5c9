"""What a checkpoint's `quantization_config` says about its weights, read once, or refused.

Two FP8 layouts load:
- `quant_method: "fp8"` (Qwen3-*-FP8, DeepSeek): every linear layer's `weight` float8_e4m3fn with
  `weight_scale_inv`, fp32 scales of its `weight_block_size` blocks (usually [128, 128]), or without a
  block size one `weight_scale` per tensor;
- `quant_method: "compressed-tensors"` with float8 weights (llm-compressor's FP8 schemes): `weight`
  float8 with `weight_scale` per output channel [out, 1], per tensor [1], or per block.
Activations are quantized at run time, per token (and per group of the block's width for block weights);
a checkpoint's static activation scales (`input_scale`) are not read.

One 4-bit layout loads: `quant_method: "mxfp4"` (gpt-oss), whose mixture-of-experts weights alone are
MXFP4 (`kernels/mxfp4.py`), every other module full precision, as transformers reads it; its
`modules_to_not_convert` lists those other modules and must not list the experts.

This module imports neither torch nor transformers.
"""

import re
from dataclasses import dataclass

SUPPORTED_METHODS = ("fp8", "compressed-tensors", "mxfp4")
_SUPPORTED_TEXT = (
    "supported: 'fp8' (float8 e4m3 weights, per tensor or per weight_block_size block), "
    "'compressed-tensors' with float8 weights (per channel, per tensor or per block) and 'mxfp4' "
    "(mixture-of-experts weights in MXFP4, as gpt-oss's checkpoints)"
)
_STRATEGIES = ("channel", "tensor", "block")  # compressed-tensors' weight scale layouts that load
# modules a checkpoint may leave unquantized that the engine never quantizes anyway
_ALWAYS_FULL_PRECISION = ("lm_head", "embed_tokens")
_EXPERTS = "model.layers.0.mlp.experts"  # a mixture-of-experts layer's experts, as transformers names them


@dataclass(frozen=True)
class Fp8Weights:
    """Linear weights in float8 e4m3 with one fp32 scale per `block` (rows, columns) of each weight;
    `block` None: one per output channel (a per-tensor scale is that scale on every row)."""

    block: tuple[int, int] | None = None


@dataclass(frozen=True)
class Mxfp4Experts:
    """Mixture-of-experts weights in MXFP4: e2m1 values two a byte with an e8m0 scale per 32 inputs; every
    other weight full precision."""


def read_quantization(quantization) -> Fp8Weights | Mxfp4Experts | None:
    """The weight layout a config.json's `quantization_config` describes (None when it has none);
    ValueError for a method or a setting the engine cannot load, naming it and what is supported."""
    if not quantization:
        return None
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict()  # a transformers QuantizationConfigMixin
    method = quantization.get("quant_method", "?")
    if method == "fp8":
        return _read_fp8(quantization)
    if method == "compressed-tensors":
        return _read_compressed_tensors(quantization)
    if method == "mxfp4":
        return _read_mxfp4(quantization)
    raise ValueError(f"quantized checkpoints with quant_method {method!r} are not supported; {_SUPPORTED_TEXT}")


def _read_fp8(quantization: dict) -> Fp8Weights:
    """quant_method "fp8": e4m3 weights, per weight_block_size block or per tensor."""
    if quantization.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"FP8 checkpoints in fmt {quantization['fmt']!r} are not supported; only e4m3 is")
    _check_ignored(quantization.get("ignored_layers") or quantization.get("modules_to_not_convert"))
    block = quantization.get("weight_block_size")
    return Fp8Weights(None if block is None else _block(block, "weight_block_size"))


def _read_compressed_tensors(quantization: dict) -> Fp8Weights:
    """quant_method "compressed-tensors": each config group's weights must be 8-bit floats, per channel, per
    tensor or per block, and every group alike."""
    _check_ignored(quantization.get("ignore"))
    layouts = set()
    for name, group in (quantization.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        strategy = weights.get("strategy")
        if (weights.get("type"), weights.get("num_bits")) != ("float", 8) or strategy not in _STRATEGIES:
            raise ValueError(
                f"compressed-tensors group {name!r} quantizes weights as {weights.get('num_bits')}-bit "
                f"{weights.get('type')} per {strategy}, which is not supported; {_SUPPORTED_TEXT}"
            )
        block = weights.get("block_structure") if strategy == "block" else None
        layouts.add(None if block is None else _block(block, "block_structure"))
    if len(layouts) != 1:
        raise ValueError(
            f"compressed-tensors checkpoints need one config group of float8 weights, got {len(layouts)} layouts"
        )
    return Fp8Weights(layouts.pop())


def _read_mxfp4(quantization: dict) -> Mxfp4Experts:
    """quant_method "mxfp4": the experts in MXFP4, which modules_to_not_convert must leave in it."""
    unconverted = [key for key in quantization.get("modules_to_not_convert") or () if _matches(key, _EXPERTS)]
    if unconverted:
        raise ValueError(
            f"this MXFP4 checkpoint leaves its experts unquantized (modules_to_not_convert: "
            f"{', '.join(unconverted[:3])}), which is not supported: the mixture-of-experts weights must be "
            "MXFP4 (the attention, the router, the embeddings and the LM head always load in full precision)"
        )
    return Mxfp4Experts()


def _matches(key: str, module: str) -> bool:
    """Whether modules_to_not_convert's `key` names `module`, as transformers matches them: a regular
    expression matching its start, or a suffix."""
    return re.match(key, module) is not None or module.endswith(key)


def _block(block, name: str) -> tuple[int, int]:
    """A block size of the config, as (rows, columns) of positive whole numbers."""
    if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ValueError(f"{name} must be two positive whole numbers [rows, columns], got {block!r}")
    if block[1] % 16:  # the FP8 tensor cores take 16 columns at a time, and a block's columns share a scale
        raise ValueError(f"{name} {block!r}: a block's columns must be a multiple of 16 (published: [128, 128])")
    return tuple(block)


def _check_ignored(ignored) -> None:
    """Refuse a checkpoint that leaves a decoder projection unquantized: every linear layer of the decoder
    is loaded alike (the LM head and the embeddings are always full precision)."""
    others = [name for name in ignored or () if not name.endswith(_ALWAYS_FULL_PRECISION)]
    if others:
        raise ValueError(
            f"this checkpoint leaves {', '.join(others[:3])} unquantized, which is not supported: every linear "
            f"layer of the decoder must be float8 (only {' and '.join(_ALWAYS_FULL_PRECISION)} may stay full precision)"
        )
