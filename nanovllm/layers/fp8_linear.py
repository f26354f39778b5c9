"""Linear layers with FP8 weights: made so before an FP8 checkpoint's tensors load into them
(`store_fp8_weights`), or quantized from their full-precision weights once those have loaded
(`quantize_weights`, `quantization="fp8"`).

Every column- and row-parallel projection of the decoder goes FP8 (attention's qkv and o, the MLP's
gate_up and down, the Gated DeltaNet's q|k|v|z and out) but one that keeps full precision (the Gated
DeltaNet's b|a); the embeddings, the norms and the LM head stay full precision. Each rank converts its
own slice: a column-parallel layer's scales are sharded with its output rows; a row-parallel layer's
rows are whole output features, so a per-channel scale is the whole row's on every rank (quantizing at
load takes the largest magnitude over every rank's part of the row), and block scales are sharded with
their columns. A block never straddles two ranks' slices or two fused shards (ValueError otherwise).
"""

import torch
import torch.distributed as dist
from torch import nn

from nanovllm.kernels.fp8_kv import FP8_DTYPE
from nanovllm.kernels.fp8_weights import block_amax, dequantize_blocks, quantize_with, scales_of
from nanovllm.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear


def fp8_layers(model: nn.Module) -> list[tuple[str, LinearBase]]:
    """The layers whose weights go FP8, by name: every column- and row-parallel projection but those that keep
    full precision."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and not m.keeps_full_precision
    ]


def layer_block(layer: LinearBase, block: tuple[int, int] | None) -> tuple[int, int]:
    """The block one scale of `layer`'s weight covers: `block`, or with None one output row of this rank."""
    return (1, layer.weight.size(1)) if block is None else block


def check_whole_blocks(name: str, layer: LinearBase, block: tuple[int, int]) -> None:
    """ValueError where a block would straddle two ranks' slices or two fused shards of `layer` (its
    last block may be partial only where its rows or columns are neither split nor fused)."""
    rows, columns = block
    if isinstance(layer, RowParallelLinear) and layer.tp_size > 1 and layer.weight.size(1) % columns:
        raise ValueError(
            f"{name}: each rank's {layer.weight.size(1)} input features are not a whole number of FP8 blocks of "
            f"{columns} columns; use a tensor_parallel_size that splits whole blocks"
        )
    shard_sizes = getattr(layer, "shard_sizes", {None: layer.output_size})
    if isinstance(layer, ColumnParallelLinear) and (len(shard_sizes) > 1 or layer.tp_size > 1):
        for shard_id, size in shard_sizes.items():
            if (size // layer.tp_size) % rows:
                part = "" if shard_id is None else f" of shard {shard_id!r}"
                raise ValueError(
                    f"{name}: each rank's {size // layer.tp_size} output rows{part} are not a whole number of FP8 "
                    f"blocks of {rows} rows; use a tensor_parallel_size that splits whole blocks"
                )


def _set_fp8(layer: LinearBase, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> None:
    """Give `layer` the FP8 weight [out, in] and its fp32 block scales, each with its checkpoint loader."""
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.weight.weight_loader = layer.weight_loader
    layer.weight_scale = nn.Parameter(scale, requires_grad=False)
    layer.weight_scale.weight_loader = layer.scale_loader
    layer.weight_scale.rows_per_entry = block[0]  # a fused loader's unit: weight rows per row of scales
    # scales split as the weight's rows (column-parallel) or as its columns when they are per block
    per_channel = block[1] == weight.size(1) and block[0] == 1
    layer.weight_scale.tp_dim = None if isinstance(layer, RowParallelLinear) and per_channel else layer.tp_dim
    layer.weight_block = block


def store_fp8_weights(model: nn.Module, block: tuple[int, int] | None) -> None:
    """Make every FP8 layer of `model` hold an empty FP8 weight and its scales (per `block`, None: per
    output channel) for an FP8 checkpoint to load into."""
    for name, layer in fp8_layers(model):
        layer_blocks = layer_block(layer, block)
        check_whole_blocks(name, layer, layer_blocks)
        out_size, in_size = layer.weight.shape
        scale_shape = (-(-out_size // layer_blocks[0]), -(-in_size // layer_blocks[1]))
        device = layer.weight.device
        weight = torch.empty(out_size, in_size, dtype=FP8_DTYPE, device=device)
        _set_fp8(layer, weight, torch.ones(scale_shape, dtype=torch.float32, device=device), layer_blocks)


def quantize_weights(model: nn.Module, block: tuple[int, int] | None) -> None:
    """Quantize every FP8 layer's loaded full-precision weight (this rank's slice) to FP8 with one scale
    per `block` (None: per output channel, the whole row's on every rank of a row-parallel layer)."""
    for name, layer in fp8_layers(model):
        layer_blocks = layer_block(layer, block)
        check_whole_blocks(name, layer, layer_blocks)
        weight = layer.weight.data  # [out, in] of this rank
        amax = block_amax(weight, layer_blocks)
        if block is None and isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX)  # every rank holds a part of each row
        scale = scales_of(amax)
        _set_fp8(layer, quantize_with(weight, scale, layer_blocks), scale, layer_blocks)


def dequantize_tensor(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None) -> torch.Tensor:
    """A whole float8 checkpoint tensor times its scales, in fp32: per tensor ([1] or []), per row ([out, 1])
    or per `block`. For a tensor the engine keeps in full precision (an FP8 checkpoint's LM head or embedding)."""
    # weight: [out, in] fp8 -> [out, in] fp32
    if scale.numel() == 1:
        return weight.float() * scale.float().reshape(())
    rows_block = scale.size(0) == weight.size(0) and scale.size(-1) == 1
    return dequantize_blocks(weight, scale.float(), (1, weight.size(1)) if rows_block or block is None else block)
