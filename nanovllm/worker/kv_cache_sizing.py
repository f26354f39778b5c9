"""How large one rank's KV cache is, and the cache built and bound to the attention layers.

The start-up order sets what is measured: the model is built and warmed up
(its activation peak recorded), then `kv_capacity` turns the memory left into
blocks of `KVCacheSpec.block_bytes` and `bind_kv_cache` allocates them and
hands each attention layer its views and its cache group. The capacity is

    config.num_kvcache_blocks                               where it is set, else
    min(blocks that fit, max_num_seqs * blocks held)        the least over the ranks

where blocks held are those one sequence at `context_len` tokens holds over
every cache group (`CacheLayout.blocks_held`), and blocks that fit are, on
CUDA, gpu_memory_utilization of the device less what is in use and the
warm-up's extra peak, and on the CPU cpu_kvcache_gb, refused when it exceeds a
share of the memory available. Sizing reads the cache through its bytes per
block alone; the spec's shape comes from the attention layers and the cache
layout (`kv_cache_spec`), the one place that reads them.
"""

import os
from collections.abc import Sequence
from dataclasses import replace

import torch

from nanovllm.cache.layout import CacheLayout
from nanovllm.config import Config
from nanovllm.layers.attention import Attention
from nanovllm.utils.parallel import all_ranks_min
from nanovllm.worker.kv_cache import KVCache, KVCacheSpec, kv_cache_dtype

_GIB = 1 << 30
_CPU_KV_CACHE_SHARE = 0.9  # of the available memory; the rest is headroom for activations


def available_memory_bytes() -> int:
    """Memory a new allocation can take without swapping: MemAvailable from /proc/meminfo, else the free
    physical pages os.sysconf reports (all physical pages where it cannot tell which are free)."""
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    pages = "SC_AVPHYS_PAGES" if "SC_AVPHYS_PAGES" in os.sysconf_names else "SC_PHYS_PAGES"
    return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")


def kv_cache_spec(config: Config, attention_layers: Sequence[Attention]) -> KVCacheSpec:
    """The layout of one rank's cache: blocks of K and V for the layers of one cache group
    (`config.kv_layout.page_layers`), every one shaped as the first of `attention_layers` (its KV heads this
    rank's share), in the element type `config.kv_cache_dtype` asks for."""
    first = attention_layers[0]
    dtype = kv_cache_dtype(config.kv_cache_dtype, config.torch_dtype)
    page_layers = config.kv_layout.page_layers
    return KVCacheSpec(dtype, config.kv_block_size, first.num_kv_heads, first.head_dim, page_layers)


def most_blocks_used(config: Config) -> int:
    """The blocks `max_num_seqs` sequences at `context_len` tokens hold at once, over every cache group:
    more than that is never used."""
    per_sequence = config.kv_layout.blocks_held(config.context_len, config.kv_block_size, config.kv_lookback)
    return config.max_num_seqs * per_sequence


def kv_capacity(config: Config, block_bytes: int, device: torch.device, world_size: int) -> int:
    """Blocks of `block_bytes` the cache gets: the configured number, or what memory holds (never more than
    every sequence at full length could use), the same on every rank."""
    if config.num_kvcache_blocks != -1:
        return config.num_kvcache_blocks
    num_blocks = min(_blocks_that_fit(config, block_bytes, device), most_blocks_used(config))
    if world_size > 1:
        # every rank must hold the blocks rank 0's scheduler hands out
        num_blocks = all_ranks_min(num_blocks, device)
    if num_blocks < 1:
        raise ValueError(
            f"cpu_kvcache_gb={config.cpu_kvcache_gb} holds no KV block of "
            f"{block_bytes / _GIB:.3f} GiB; raise it or lower block_size"
        )
    return num_blocks


def bind_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    attention_layers: Sequence[Attention],
    layout: CacheLayout,
    device: torch.device,
) -> KVCache:
    """The cache of `num_blocks` blocks, allocated, with each of `attention_layers` (in module order: the
    paged decoder layers in increasing order) bound to its slot's views and its cache group
    (`CacheLayout.group_of`)."""
    cache = spec.allocate(num_blocks, device)
    paged_layers = sorted(layer for group in layout.groups for layer in group.layers)
    for module, layer in zip(attention_layers, paged_layers, strict=True):
        group, slot = layout.group_of(layer)
        module.bind_kv_cache(replace(cache.slots[slot], group=group))
    return cache


def _blocks_that_fit(config: Config, block_bytes: int, device: torch.device) -> int:
    if device.type == "cpu":
        return _cpu_blocks_that_fit(config, block_bytes)
    return _gpu_blocks_that_fit(config, block_bytes, device)


def _cpu_blocks_that_fit(config: Config, block_bytes: int) -> int:
    """The blocks cpu_kvcache_gb holds; ValueError when the part of them sequences can use exceeds the
    memory's share for the cache."""
    num_blocks = int(config.cpu_kvcache_gb * _GIB) // block_bytes
    cache_bytes = min(num_blocks, most_blocks_used(config)) * block_bytes
    available = available_memory_bytes()
    allowed = _CPU_KV_CACHE_SHARE * available
    if cache_bytes > allowed:
        raise ValueError(
            f"a {cache_bytes / _GIB:.3g} GiB KV cache (cpu_kvcache_gb={config.cpu_kvcache_gb}) does not fit in "
            f"memory: {available / _GIB:.3g} GiB is available and the cache may take at most "
            f"{_CPU_KV_CACHE_SHARE:.0%} of it ({allowed / _GIB:.3g} GiB), leaving the rest for activations; "
            f"lower cpu_kvcache_gb (or set num_kvcache_blocks)"
        )
    return num_blocks


def _gpu_blocks_that_fit(config: Config, block_bytes: int, device: torch.device) -> int:
    """The blocks gpu_memory_utilization of the device holds besides what is in use (weights, other
    processes) and the extra peak the warm-up reached (activations); ValueError when not even one does."""
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    used_elsewhere = total - free
    warm_up_extra = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
    budget = total * config.gpu_memory_utilization - used_elsewhere - warm_up_extra
    if budget < block_bytes:
        raise ValueError(
            f"no room for the KV cache: one block needs {block_bytes / _GIB:.3f} GiB but only "
            f"{max(budget, 0) / _GIB:.3f} GiB is left of gpu_memory_utilization="
            f"{config.gpu_memory_utilization} x {total / _GIB:.1f} GiB; raise "
            f"gpu_memory_utilization, or lower max_model_len/max_num_batched_tokens"
        )
    return int(budget) // block_bytes
