"""KVCacheSpec sizes the cache; its allocation gives each slot of a block views of the one cache tensor, and
binding hands each attention layer its slot's views and its cache group; the capacity is capped at what the
sequences can hold over every group."""

from types import SimpleNamespace

import pytest
import torch

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, SharedKV, SlidingWindow
from nanovllm.kernels.fp8_kv import FP8_DTYPE, SCALE_DTYPE
from nanovllm.worker.kv_cache import KVCacheSpec, KVShape
from nanovllm.worker.kv_cache_sizing import bind_kv_cache, kv_cache_spec, kv_capacity

LAYERS, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 3, 5, 16, 2, 128


def spec(dtype: torch.dtype) -> KVCacheSpec:
    return KVCacheSpec(dtype, BLOCK_SIZE, (KVShape(KV_HEADS, HEAD_DIM, LAYERS),))


def by_layer(cache, layers: int = LAYERS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> torch.Tensor:
    """The values of a cache whose layers are all alike, [2, layers, blocks, block_size, kv_heads, head_dim]."""
    return cache.values.view(2, layers, cache.num_blocks, -1, kv_heads, head_dim)


@pytest.mark.parametrize(
    "dtype, head_bytes, name",
    [(torch.bfloat16, 256, "bfloat16"), (FP8_DTYPE, 132, "fp8_e4m3"), (torch.float32, 512, "float32")],
)
def test_bytes_per_token_count_k_and_v_of_every_layer_and_head_with_the_scales(dtype, head_bytes, name):
    s = spec(dtype)
    # 128 values of a head, plus a 4-byte scale for FP8
    assert s.bytes_per_token == 2 * LAYERS * KV_HEADS * head_bytes
    assert s.block_bytes == BLOCK_SIZE * s.bytes_per_token
    assert s.dtype_name == name
    assert s.is_fp8 == (dtype == FP8_DTYPE) and s.prefill_reads_cache == s.is_fp8
    assert s.scale_dtype == (SCALE_DTYPE if dtype == FP8_DTYPE else None)


def test_the_spec_follows_the_config_and_the_attention_layers(qwen3_dir):
    from nanovllm.config import Config

    # the heads are the attention layers' (this rank's share); the layers a block holds, the cache layout's
    layers = [SimpleNamespace(num_kv_heads=1, head_dim=64, owns_cache=True)] * 2
    for kv_cache_dtype, want in (("auto", torch.float32), ("fp8", FP8_DTYPE)):
        config = Config(qwen3_dir, device="cpu", kv_cache_dtype=kv_cache_dtype, block_size=32)
        s = kv_cache_spec(config, layers)
        assert [len(g.layers) for g in config.kv_layout.groups] == [2]  # the tiny model's two layers, one group
        assert (s.dtype, s.block_size, s.shapes) == (want, 32, (KVShape(1, 64, 2),))


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE])
def test_allocation_shapes_and_each_layer_views_the_shared_tensors(dtype):
    cache = spec(dtype).allocate(BLOCKS, "cpu")
    # layers all alike: a unit per layer's K and V, each layer's view contiguous
    assert cache.values.shape == (2 * LAYERS, BLOCKS, BLOCK_SIZE * KV_HEADS * HEAD_DIM) and cache.values.dtype == dtype
    slots = cache.slots[KVShape(KV_HEADS, HEAD_DIM, LAYERS)]
    assert cache.num_blocks == BLOCKS and len(slots) == LAYERS
    assert not cache.values.float().any()
    for i, layer in enumerate(slots):
        assert layer.k.shape == layer.v.shape == (BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        assert layer.k.is_contiguous() and layer.v.is_contiguous()
        assert layer.block_size == BLOCK_SIZE and layer.is_fp8 == (dtype == FP8_DTYPE)
        layer.k[1, 2, 0, 3] = 1.0
        layer.v[4, 0, 1, 5] = 2.0
        assert by_layer(cache)[0, i, 1, 2, 0, 3] == 1.0 and by_layer(cache)[1, i, 4, 0, 1, 5] == 2.0
    assert cache.values.float().count_nonzero() == 2 * LAYERS
    if dtype == FP8_DTYPE:
        assert cache.scales.shape == (2 * LAYERS, BLOCKS, KV_HEADS * BLOCK_SIZE) and cache.scales.dtype == SCALE_DTYPE
        assert torch.equal(cache.scales, torch.ones_like(cache.scales))  # an unwritten slot reads as zeros
        layer = slots[1]
        layer.k_scale[3, 1, 7] = 0.5
        layer.v_scale[0, 0, 0] = 0.25
        scales = cache.scales.view(2, LAYERS, BLOCKS, KV_HEADS, BLOCK_SIZE)
        assert scales[0, 1, 3, 1, 7] == 0.5 and scales[1, 1, 0, 0, 0] == 0.25


def test_a_model_dtype_cache_has_no_scales():
    cache = spec(torch.bfloat16).allocate(BLOCKS, "cpu")
    assert cache.scales is None
    for layer in cache.slots[KVShape(KV_HEADS, HEAD_DIM, LAYERS)]:
        assert layer.k_scale is None and layer.v_scale is None and layer.scales == (None, None)
        assert not layer.is_fp8


@pytest.mark.parametrize("dtype", [torch.float32, FP8_DTYPE])
def test_a_layers_store_writes_its_slots_of_the_shared_cache(dtype):
    torch.manual_seed(0)
    cache = KVCacheSpec(dtype, 4, (KVShape(2, 8, 2),)).allocate(3, "cpu")
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    cache.slot(2, 8, 1).store(k, v, torch.tensor([5, -1, 11]))
    kv = by_layer(cache, 2, 2, 8)
    assert not kv[:, 0].float().any()
    stored_k = kv[0, 1].flatten(0, 1)  # [slots, kv_heads, d]
    assert stored_k[[0, 1, 2, 3, 4, 6, 7, 8, 9, 10]].float().count_nonzero() == 0
    if dtype == FP8_DTYPE:
        scales = cache.scales.view(2, 2, 3, 2, 4)[0, 1]  # [blocks, kv_heads, block_size]
        got = stored_k[5].float() * scales[1, :, 1, None]
        torch.testing.assert_close(got, k[0], rtol=2**-3, atol=0)
        assert (scales != 1).sum() == 2 * 2  # two stored slots, two heads each
    else:
        assert torch.equal(stored_k[5], k[0]) and torch.equal(stored_k[11], k[2])
        assert torch.equal(kv[1, 1].flatten(0, 1)[11], v[2])


class BindingProbe:
    """An attention layer of KV_HEADS heads of HEAD_DIM that only keeps the cache it is bound to."""

    owns_cache, num_kv_heads, head_dim = True, KV_HEADS, HEAD_DIM

    def bind_kv_cache(self, cache):
        self.kv_cache = cache


# layers 0, 1, 3, 4 slide over 8 tokens, 2 and 5 read every token: blocks of 2 layers, groups sliding (0, 1),
# sliding (3, 4) and full (2, 5), in the order of their first layer
SPECS = [SlidingWindow(KV_HEADS, HEAD_DIM, 8)] * 2 + [FullAttention(KV_HEADS, HEAD_DIM)]
SPECS = SPECS * 2


@pytest.mark.parametrize("dtype", [torch.float32, FP8_DTYPE])
def test_each_attention_layer_is_bound_to_its_slot_and_its_cache_group(dtype):
    layout = cache_layout(SPECS)
    assert [group.layers for group in layout.groups] == [(0, 1), (3, 4), (2, 5)]
    modules = [BindingProbe() for _ in SPECS]
    spec = KVCacheSpec(dtype, BLOCK_SIZE, (KVShape(KV_HEADS, HEAD_DIM, 2),))
    cache = bind_kv_cache(spec, BLOCKS, modules, layout, "cpu")
    kv = by_layer(cache, 2)
    bound = [(m.kv_cache.group, m.kv_cache.k.data_ptr(), m.kv_cache.v.data_ptr()) for m in modules]
    slot = lambda j: (kv[0, j].data_ptr(), kv[1, j].data_ptr())
    assert bound == [(0, *slot(0)), (0, *slot(1)), (2, *slot(0)), (1, *slot(0)), (1, *slot(1)), (2, *slot(1))]
    if dtype == FP8_DTYPE:
        assert [m.kv_cache.k_scale.data_ptr() for m in modules] == [
            cache.scales[j].data_ptr() for j in (0, 1, 0, 0, 1, 1)
        ]
    # a write through layer 4's view lands in slot 1 of the shared tensor
    modules[4].kv_cache.v[3, 2, 1, 0] = 1.0
    assert kv[1, 1, 3, 2, 1, 0] == 1.0 and cache.values.float().count_nonzero() == 1


def test_binding_refuses_a_layer_count_other_than_the_paged_layers():
    layout = cache_layout(SPECS)
    with pytest.raises(ValueError):
        bind_kv_cache(spec(torch.float32), BLOCKS, [BindingProbe()] * 5, layout, "cpu")


def test_the_capacity_is_capped_at_the_blocks_every_sequence_holds_over_the_groups():
    # at 64 tokens, blocks of 4: a full-attention group holds 16 blocks, a sliding one of 8 tokens holds
    # the window's 2 blocks, one the window straddles and, with a lookback of 4, one more
    config = SimpleNamespace(
        num_kvcache_blocks=-1,
        cpu_kvcache_gb=1.0,
        max_num_seqs=3,
        kv_layout=cache_layout([SlidingWindow(1, 8, 8), FullAttention(1, 8)]),
        context_len=64,
        kv_block_size=4,
        kv_lookback=4,
    )
    assert config.kv_layout.blocks_held(64, 4, 4) == 16 + 4
    assert kv_capacity(config, 1024, torch.device("cpu"), 1) == 3 * (16 + 4)


class ShapedProbe(BindingProbe):
    """A binding probe of its own K/V shape; one that reads another layer's K/V keeps no cache."""

    def __init__(self, num_kv_heads: int, head_dim: int, owns_cache: bool = True):
        self.num_kv_heads, self.head_dim, self.owns_cache = num_kv_heads, head_dim, owns_cache


@pytest.mark.parametrize("dtype", [torch.float32, FP8_DTYPE])
def test_layers_of_two_kv_shapes_share_each_blocks_bytes_and_a_shared_layer_has_none(dtype):
    # Gemma 4's kinds: sliding layers of 4 heads of 16, global ones of 1 head of 32 (half as wide), and a
    # last layer that reads layer 0's K/V: a block holds one sliding layer's K and V, or two global ones'
    S, G = (4, 16), (1, 32)
    specs = [SlidingWindow(*S, 8), SlidingWindow(*S, 8), FullAttention(*G)] * 2 + [SharedKV(0)]
    layout = cache_layout(specs)
    assert [g.layers for g in layout.groups] == [(0,), (1,), (3,), (4,), (2, 5)]
    modules = [ShapedProbe(*shape) for shape in (S, S, G) * 2] + [ShapedProbe(*S, owns_cache=False)]
    setting = "fp8" if dtype == FP8_DTYPE else "auto"
    config = SimpleNamespace(
        kv_cache_dtype=setting, torch_dtype=torch.float32, kv_block_size=BLOCK_SIZE, kv_layout=layout
    )
    spec = kv_cache_spec(config, modules)
    assert spec.shapes == (KVShape(*S, 1), KVShape(*G, 2))
    assert spec.unit_width == 64 and spec.num_units == 2
    # the bytes of one sliding layer's K and V a token: every shape's layers fill them
    assert spec.bytes_per_token == 2 * (64 * dtype.itemsize + (4 * 4 if dtype == FP8_DTYPE else 0))
    cache = bind_kv_cache(spec, BLOCKS, modules, layout, "cpu")
    assert cache.values.shape == (2, BLOCKS, BLOCK_SIZE * 64)
    sliding, wide = modules[0].kv_cache, modules[5].kv_cache
    assert [m.kv_cache.group for m in modules[:6]] == [0, 1, 4, 2, 3, 4] and not hasattr(modules[6], "kv_cache")
    # a sliding layer fills its units; the global ones take each half of them, their blocks strided
    assert sliding.k.is_contiguous() and sliding.k.data_ptr() == cache.values[0].data_ptr()
    assert wide.k.shape == (BLOCKS, BLOCK_SIZE, *G) and wide.k.stride() == (BLOCK_SIZE * 64, 32, 32, 1)
    half = BLOCK_SIZE * 32 * dtype.itemsize
    assert wide.v.data_ptr() == cache.values[1].data_ptr() + half
    assert modules[2].kv_cache.k.data_ptr() == cache.values[0].data_ptr()
    wide.v[3, 2, 0, 5] = 1.0
    assert cache.values[1, 3, BLOCK_SIZE * 32 + 2 * 32 + 5] == 1.0 and cache.values.float().count_nonzero() == 1
    if dtype == FP8_DTYPE:
        # scales: a sliding layer's 4 heads, or the 1 head of each of two global layers, a token
        assert cache.scales.shape == (2, BLOCKS, 4 * BLOCK_SIZE)
        assert wide.v_scale.shape == (BLOCKS, 1, BLOCK_SIZE)
        assert wide.v_scale.data_ptr() == cache.scales[1].data_ptr() + BLOCK_SIZE * 4
    # a store through the strided views writes where the views read
    torch.manual_seed(0)
    k, v = torch.randn(2, *G), torch.randn(2, *G)
    wide.store(k, v, torch.tensor([BLOCK_SIZE + 1, 4 * BLOCK_SIZE]))
    tol = dict(rtol=2**-3, atol=0) if dtype == FP8_DTYPE else dict(rtol=0, atol=0)
    got = wide.k[1, 1].float() * (wide.k_scale[1, :, 1, None] if dtype == FP8_DTYPE else 1)
    torch.testing.assert_close(got, k[0], **tol)
    assert not modules[2].kv_cache.k[1].float().any()  # the other global layer's half of the block
