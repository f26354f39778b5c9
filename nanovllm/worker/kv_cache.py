"""The paged KV cache: its shape and element type (`KVCacheSpec`), the one allocation of it (`KVCache`)
and the views each attention layer works on (`LayerKVCache`).

Layout: one tensor `[2, page_layers, blocks, block_size, kv_heads, head_dim]`
(kv_heads per rank) for K and V of every paged layer. A block holds
`block_size` tokens of `page_layers` layers: those of one cache group
(`CacheLayout.groups`), layer j of the group in slot j, so that the groups
share one pool of blocks. Token t of a sequence lives, for a layer of group g,
in block `block_tables[g][t // block_size]` at offset `t % block_size`; a
model whose layers are all alike has one group and a slot per layer. The
element type is the model's, or float8 e4m3 (`kv_cache_dtype="fp8"`), which
also keeps one fp32 scale per token and KV head in `[2, page_layers, blocks,
kv_heads, block_size]` (`kernels/fp8_kv.py` describes the number format). This
is the only file outside `kernels/` that knows an FP8 cache exists: layers and
the runner see a `LayerKVCache` whose scales are None for a cache in the
model's dtype, and hand them to the kernels as they are.

A model whose paged layers differ in K/V shape (Gemma 4: sliding layers of
many narrow heads, global ones of few wide heads) has one such tensor per shape
(`KVCacheSpec.shapes`), each holding every block: the block ids are shared, and a
block a group of one shape holds lies unused in the other shapes' tensors, so
a block's bytes are those of every shape together. (Views of one flat pool cut
per shape would waste nothing, but a layer's view must stay a contiguous
[blocks, block_size, kv_heads, head_dim] tensor for the attention kernels.)
"""

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
class KVCacheSpec:
    """What one rank's cache holds per token of a block: K and V of `page_layers` layers (those of one cache
    group), `num_kv_heads` (this rank's share) heads of `head_dim` values each, in `dtype` (the model's, or
    float8 e4m3 with an fp32 scale per token and head); `block_size` tokens a block."""

    dtype: torch.dtype
    block_size: int
    num_kv_heads: int
    head_dim: int
    page_layers: int
    # the further (KV heads per rank, head_dim) shapes of paged layers, each in a tensor of its own (Gemma 4)
    other_shapes: tuple[tuple[int, int], ...] = ()

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """Every (KV heads per rank, head_dim) of the paged layers, the first one's first."""
        return ((self.num_kv_heads, self.head_dim), *self.other_shapes)

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
    def head_bytes(self) -> int:
        """Bytes of one head of one token's K (or V), with its scale: 256 for bf16 and 132 for FP8 at
        head_dim 128."""
        return self._head_bytes(self.head_dim)

    def _head_bytes(self, head_dim: int) -> int:
        scale_bytes = self.scale_dtype.itemsize if self.is_fp8 else 0
        return head_dim * self.dtype.itemsize + scale_bytes

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token of a block takes: K and V of each of its layers and KV heads, with the scales, in
        every shape's tensor."""
        return 2 * self.page_layers * sum(heads * self._head_bytes(d) for heads, d in self.shapes)

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
        reads as zeros), with each slot's views (of group 0: `bind_kv_cache` gives each layer its own), in a
        tensor per shape."""
        parts = tuple(self._allocate_shape(heads, d, num_blocks, device) for heads, d in self.shapes)
        return KVCache(self, parts)

    def _allocate_shape(self, num_kv_heads: int, head_dim: int, num_blocks: int, device) -> "KVCachePart":
        # kv: [2, page_layers, blocks, block_size, kv_heads, head_dim]
        kv = torch.zeros(
            2,
            self.page_layers,
            num_blocks,
            self.block_size,
            num_kv_heads,
            head_dim,
            dtype=self.dtype,
            device=device,
        )
        scales = None
        if self.is_fp8:
            # scales: [2, page_layers, blocks, kv_heads, block_size]
            scales = torch.ones(
                2,
                self.page_layers,
                num_blocks,
                num_kv_heads,
                self.block_size,
                dtype=self.scale_dtype,
                device=device,
            )
        slots = [
            LayerKVCache(kv[0, j], kv[1, j], *((scales[0, j], scales[1, j]) if scales is not None else ()))
            for j in range(self.page_layers)
        ]
        return KVCachePart(kv, scales, slots)


@dataclass(frozen=True, eq=False)
class KVCachePart:
    """The cache of one K/V shape: `kv` [2, page_layers, blocks, block_size, kv_heads, head_dim], the FP8
    scales [2, page_layers, blocks, kv_heads, block_size] or None, and `slots[j]`, slot j's views of both."""

    kv: torch.Tensor
    scales: torch.Tensor | None
    slots: list[LayerKVCache]


@dataclass(frozen=True, eq=False)
class KVCache:
    """One rank's allocated cache: a part per shape of `spec.shapes`; `kv`, `scales` and `slots` are the first
    shape's (the only one of a model whose paged layers are all alike)."""

    spec: KVCacheSpec
    parts: tuple[KVCachePart, ...]

    @property
    def kv(self) -> torch.Tensor:
        return self.parts[0].kv

    @property
    def scales(self) -> torch.Tensor | None:
        return self.parts[0].scales

    @property
    def slots(self) -> list[LayerKVCache]:
        return self.parts[0].slots

    def slot(self, num_kv_heads: int, head_dim: int, j: int) -> LayerKVCache:
        """Slot j's views in the tensor of the shape (KV heads per rank, head_dim)."""
        return self.parts[self.spec.shapes.index((num_kv_heads, head_dim))].slots[j]

    @property
    def num_blocks(self) -> int:
        return self.kv.size(2)
