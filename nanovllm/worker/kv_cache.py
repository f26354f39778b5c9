"""The paged KV cache: its shape and element type (`KVCacheSpec`), the one allocation of it (`KVCache`)
and the views each attention layer works on (`LayerKVCache`).

Layout: one tensor `[units, blocks, block_size * unit_width]` of K and V for
every paged layer. A block holds `block_size` tokens of the layers of one cache
group (`CacheLayout.groups`), layer j of the group in slot j, so that the groups
share one pool of blocks. Token t of a sequence lives, for a layer of group g,
in block `block_tables[g][t // block_size]` at offset `t % block_size`. A unit
is one stretch of each block of `unit_width` values a token: the K or the V of
one layer of the widest shape (kv_heads x head_dim, kv_heads per rank), or
several narrower ones side by side (a shape's items: its slots' K, then their
V, in order). A layer's K and its V are each a `[blocks, block_size, kv_heads,
head_dim]` view of a unit: contiguous where the layer fills the unit, as it
does in a model whose layers are all alike (whose tensor is then `[2, layers,
blocks, block_size, kv_heads, head_dim]`), else strided over blocks. So layers
of different shapes (Gemma 4: sliding layers of many narrow heads, global ones
of few wide heads) share the blocks' bytes: a group of narrow layers holds
more of them a block.

The element type is the model's, or float8 e4m3 (`kv_cache_dtype="fp8"`), which
also keeps one fp32 scale per token and KV head in `[units, blocks,
scale_width * block_size]` (a layer's `[blocks, kv_heads, block_size]`;
`kernels/fp8_kv.py` describes the number format). This is the only file
outside `kernels/` that knows an FP8 cache exists: layers and the runner see a
`LayerKVCache` whose scales are None for a cache in the model's dtype, and hand
them to the kernels as they are.
"""

import math
from dataclasses import dataclass

import torch

from nanovllm.kernels.fp8_kv import FP8_DTYPE, SCALE_DTYPE
from nanovllm.kernels.torch_attention import store_kvcache


def kv_cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for the `kv_cache_dtype` setting: float8 e4m3 for "fp8", else the model's."""
    return FP8_DTYPE if setting == "fp8" else model_dtype


@dataclass(frozen=True, eq=False)
class LayerKVCache:
    """One attention layer's slice of the cache: K and V `[blocks, block_size, kv_heads, head_dim]`, and
    for an FP8 cache their scales `[blocks, kv_heads, block_size]` (None otherwise). Views of the
    `KVCache` tensors: writing through them writes the cache. `group` is the cache group whose block
    tables and slots the layer reads (`Context.for_group`)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    group: int = 0

    def __post_init__(self):
        assert self.k.shape == self.v.shape and (self.k_scale is None) == (self.v_scale is None)

    @property
    def is_fp8(self) -> bool:
        return self.k_scale is not None

    @property
    def block_size(self) -> int:
        return self.k.size(1)

    @property
    def scales(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(K scales, V scales), the kernels' trailing arguments: (None, None) for a model-dtype cache."""
        return self.k_scale, self.v_scale

    def store(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write k[t], v[t] ([tokens, kv_heads, head_dim]) at flat slot `slot_mapping[t]` (-1 skipped),
        quantized for an FP8 cache. Plain PyTorch: the CPU path (on CUDA the attention layer fuses the
        store into the rotary kernel)."""
        store_kvcache(k, v, self.k, self.v, slot_mapping, self.k_scale, self.v_scale)


@dataclass(frozen=True)
class KVShape:
    """The paged layers of one K/V shape: `num_kv_heads` (this rank's share) heads of `head_dim` values, of
    which a block holds `slots` layers."""

    num_kv_heads: int
    head_dim: int
    slots: int

    @property
    def width(self) -> int:
        """Values of one token's K (or V) in one layer."""
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class KVCacheSpec:
    """What one rank's cache holds per token of a block: K and V of the layers of one cache group, each of
    one of `shapes` (their number of slots the most any group of that shape has), in `dtype` (the model's,
    or float8 e4m3 with an fp32 scale per token and head); `block_size` tokens a block."""

    dtype: torch.dtype
    block_size: int
    shapes: tuple[KVShape, ...]

    @property
    def unit_width(self) -> int:
        """Values a token of a unit holds: one layer's K (or V) of the widest shape."""
        return max(shape.width for shape in self.shapes)

    def per_unit(self, shape: KVShape) -> int:
        """Layers' K or V of `shape` a unit holds side by side."""
        return self.unit_width // shape.width

    def units_of(self, shape: KVShape) -> int:
        """Units the K and V of `shape.slots` layers take: every slot's K, then every slot's V, in order."""
        return -(-2 * shape.slots // self.per_unit(shape))

    @property
    def num_units(self) -> int:
        return max(self.units_of(shape) for shape in self.shapes)

    @property
    def scale_width(self) -> int:
        """Scales a token of a unit holds in an FP8 cache: one per KV head of each layer the unit holds."""
        return max(self.per_unit(shape) * shape.num_kv_heads for shape in self.shapes)

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8_DTYPE

    @property
    def scale_dtype(self) -> torch.dtype | None:
        """The element type of the per-token, per-head scales: fp32 for an FP8 cache, None (no scales) else."""
        return SCALE_DTYPE if self.is_fp8 else None

    @property
    def dtype_name(self) -> str:
        """The element type as vLLM names it: "fp8_e4m3", else torch's name ("bfloat16", "float32" ...)."""
        return "fp8_e4m3" if self.is_fp8 else str(self.dtype).removeprefix("torch.")

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of a block takes: every unit, with the scales of an FP8 cache."""
        scale_bytes = self.scale_width * self.scale_dtype.itemsize if self.is_fp8 else 0
        return self.num_units * (self.unit_width * self.dtype.itemsize + scale_bytes)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def prefill_reads_cache(self) -> bool:
        """Whether a prefill reads its new tokens' keys back from the cache too (through block tables):
        an FP8 cache gives back keys that differ from those computed, and a prompt must attend the
        same keys whether its prefix was cached or computed in this step."""
        return self.is_fp8

    def allocate(self, num_blocks: int, device: torch.device | str) -> "KVCache":
        """The whole cache of `num_blocks` blocks, zeroed (FP8 scales set to 1, so that an unwritten slot
        reads as zeros), with each shape's slots' views (of group 0: `bind_kv_cache` gives each layer its
        own)."""
        # values: [units, blocks, block_size * unit_width]
        values = torch.zeros(
            self.num_units, num_blocks, self.block_size * self.unit_width, dtype=self.dtype, device=device
        )
        scales = None
        if self.is_fp8:
            # scales: [units, blocks, scale_width * block_size]
            scales = torch.ones(
                self.num_units, num_blocks, self.scale_width * self.block_size, dtype=self.scale_dtype, device=device
            )
        slots = {shape: [self._views(values, scales, shape, j) for j in range(shape.slots)] for shape in self.shapes}
        return KVCache(self, values, scales, slots)

    def _views(self, values: torch.Tensor, scales: torch.Tensor | None, shape: KVShape, j: int) -> "LayerKVCache":
        """Slot j of `shape`: its K is the shape's item j and its V item slots + j (`_item`)."""
        bs, heads, d = self.block_size, shape.num_kv_heads, shape.head_dim
        k, v = (self._item(values, shape, item, (bs, heads, d)) for item in (j, shape.slots + j))
        if scales is None:
            return LayerKVCache(k, v)
        k_scale, v_scale = (self._item(scales, shape, item, (heads, bs)) for item in (j, shape.slots + j))
        return LayerKVCache(k, v, k_scale, v_scale)

    def _item(self, x: torch.Tensor, shape: KVShape, item: int, dims: tuple[int, ...]) -> torch.Tensor:
        """Item `item` of `shape` in `x` ([units, blocks, per-block values]): place i % n of unit i // n, n the
        items a unit holds -> [blocks, *dims]."""
        unit, place = divmod(item, self.per_unit(shape))
        size = math.prod(dims)
        return x[unit, :, place * size : (place + 1) * size].view(x.size(1), *dims)


@dataclass(frozen=True, eq=False)
class KVCache:
    """One rank's allocated cache: `values` [units, blocks, block_size * unit_width], the FP8 scales
    [units, blocks, scale_width * block_size] or None, and each shape's slots' views."""

    spec: KVCacheSpec
    values: torch.Tensor
    scales: torch.Tensor | None
    slots: dict[KVShape, list[LayerKVCache]]

    def slot(self, num_kv_heads: int, head_dim: int, j: int) -> LayerKVCache:
        """Slot j's views of the layers of (KV heads per rank, head_dim)."""
        shape = next(s for s in self.spec.shapes if (s.num_kv_heads, s.head_dim) == (num_kv_heads, head_dim))
        return self.slots[shape][j]

    @property
    def num_blocks(self) -> int:
        return self.values.size(1)
