"""How large one rank's caches are (KV blocks and recurrent-state slots), and the KV cache built and bound to
the attention layers.

The start-up order sets what is measured: the model is built and warmed up
(its activation peak recorded), then `cache_capacity` turns the memory left
into blocks of `KVCacheSpec.block_bytes` and, on a model with recurrent
layers, state slots of `StateCacheSpec.slot_bytes`, and `bind_kv_cache`
allocates the blocks and hands each attention layer its views and its cache
group. The budget is, on CUDA, gpu_memory_utilization of the device less what
is in use and the warm-up's extra peak, and on the CPU cpu_kvcache_gb, refused
when the part sequences can use exceeds a share of the memory available. A
model without recurrent layers gets

    config.num_kvcache_blocks                               where it is set, else
    min(blocks that fit, max_num_seqs * blocks held)        the least over the ranks

where blocks held are those one sequence at `context_len` tokens holds over
every cache group (`CacheLayout.blocks_held`). A model with recurrent layers
splits the budget by need: a sequence at `context_len` holds P blocks and
(running, with its snapshot) two slots, so the slots get the share
2 * slot_bytes / (P * block_bytes + 2 * slot_bytes), at most
3 * max_num_seqs slots (two per running request, one more per sequence for the
prefix cache's snapshots) and at least 2, and the blocks the rest; with
num_kvcache_blocks set, the blocks are as given and the slots what remains.
Sizing reads the caches through their bytes per block and per slot alone; the
KV spec's shape comes from the attention layers and the cache layout
(`kv_cache_spec`), the one place that reads them.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from nanovllm.cache.layout import CacheLayout
from nanovllm.config import Config
from nanovllm.core.state_slots import SLOTS_PER_SEQUENCE
from nanovllm.layers.attention import Attention
from nanovllm.utils.parallel import all_ranks_min
from nanovllm.worker.kv_cache import KVCache, KVCacheSpec, KVShape, kv_cache_dtype

_GIB = 1 << 30
_CPU_KV_CACHE_SHARE = 0.9  # of the available memory; the rest is headroom for activations
# state slots per sequence at most: a running request's live and snapshot slots, and one for a cached snapshot
_MOST_STATE_SLOTS_PER_SEQ = 3
_LEAST_STATE_SLOTS = SLOTS_PER_SEQUENCE  # one request's live and snapshot slots


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
    (`config.kv_layout`), as many slots of each shape of the `attention_layers` that keep a cache (their
    KV heads this rank's share) as its groups have, in the element type `config.kv_cache_dtype` asks for."""
    slots: dict[tuple[int, int], int] = {}
    for module, _, slot in _paged_owners(attention_layers, config.kv_layout):
        shape = (module.num_kv_heads, module.head_dim)
        slots[shape] = max(slots.get(shape, 0), slot + 1)
    dtype = kv_cache_dtype(config.kv_cache_dtype, config.torch_dtype)
    return KVCacheSpec(dtype, config.kv_block_size, tuple(KVShape(*shape, n) for shape, n in slots.items()))


def _paged_owners(attention_layers: Sequence[Attention], layout: CacheLayout) -> list[tuple[Attention, int, int]]:
    """(module, cache group, slot) of each of `attention_layers` that keeps a cache (in module order: the
    paged decoder layers in increasing order); ValueError where their number is not the paged layers'."""
    paged_layers = sorted(layer for group in layout.groups for layer in group.layers)
    owners = [module for module in attention_layers if module.owns_cache]
    return [(module, *layout.group_of(layer)) for module, layer in zip(owners, paged_layers, strict=True)]


def most_blocks_used(config: Config) -> int:
    """The blocks `max_num_seqs` sequences at `context_len` tokens hold at once, over every cache group:
    more than that is never used."""
    return config.max_num_seqs * blocks_per_sequence(config)


def blocks_per_sequence(config: Config) -> int:
    """The blocks one sequence at `context_len` tokens holds over every cache group while it decodes."""
    return config.kv_layout.blocks_held(config.context_len, config.kv_block_size, config.kv_lookback)


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


@dataclass(frozen=True)
class CacheCapacity:
    """What one rank's caches hold, the same on every rank: KV blocks, and state slots (0 on a model without
    recurrent layers; the scratch slot not counted)."""

    num_blocks: int
    num_state_slots: int


def cache_capacity(
    config: Config, block_bytes: int, slot_bytes: int, device: torch.device, world_size: int
) -> CacheCapacity:
    """Blocks of `block_bytes` and state slots of `slot_bytes` (0: the model keeps no state, and the blocks are
    `kv_capacity`'s) the caches get, the same on every rank; ValueError where the budget holds not even
    two slots and a block."""
    if slot_bytes == 0:
        return CacheCapacity(kv_capacity(config, block_bytes, device, world_size), 0)
    budget = _budget_bytes(config, device)
    most_slots = _MOST_STATE_SLOTS_PER_SEQ * config.max_num_seqs
    if config.num_kvcache_blocks != -1:
        num_blocks = config.num_kvcache_blocks
        num_slots = min(most_slots, max(budget - num_blocks * block_bytes, 0) // slot_bytes)
    else:
        num_slots, num_blocks = split_budget(config, budget, block_bytes, slot_bytes)
        if device.type == "cpu":
            _check_cpu_cache_bytes(config, num_blocks * block_bytes + num_slots * slot_bytes)
    if world_size > 1:
        # every rank must hold the blocks and slots rank 0's scheduler hands out
        num_blocks = all_ranks_min(num_blocks, device)
        num_slots = all_ranks_min(num_slots, device)
    if num_slots < _LEAST_STATE_SLOTS or num_blocks < 1:
        setting = "cpu_kvcache_gb" if device.type == "cpu" else "gpu_memory_utilization"
        raise ValueError(
            f"no room for the caches: {budget / _GIB:.3f} GiB ({setting}={getattr(config, setting)}"
            f"{'' if device.type == 'cpu' else ' less what is in use'}) must hold {_LEAST_STATE_SLOTS} "
            f"recurrent-state slots of {slot_bytes / _GIB:.3f} GiB and {max(config.num_kvcache_blocks, 1)} KV "
            f"block(s) of {block_bytes / _GIB:.3f} GiB; raise {setting}, or lower num_kvcache_blocks"
        )
    return CacheCapacity(num_blocks, num_slots)


def split_budget(config: Config, budget: int, block_bytes: int, slot_bytes: int) -> tuple[int, int]:
    """(state slots, KV blocks) that `budget` bytes hold, split by what a sequence at `context_len` tokens
    needs: P blocks and two slots, so the slots get 2 * slot_bytes / (P * block_bytes + 2 * slot_bytes) of
    it, between 2 and 3 * max_num_seqs slots, and the blocks what is left (at most what every sequence
    could use)."""
    # floor(budget * share / slot_bytes), in integers
    pair = SLOTS_PER_SEQUENCE
    by_share = pair * budget // (blocks_per_sequence(config) * block_bytes + pair * slot_bytes)
    num_slots = max(_LEAST_STATE_SLOTS, min(_MOST_STATE_SLOTS_PER_SEQ * config.max_num_seqs, by_share))
    num_blocks = min(max(budget - num_slots * slot_bytes, 0) // block_bytes, most_blocks_used(config))
    return num_slots, num_blocks


def bind_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    attention_layers: Sequence[Attention],
    layout: CacheLayout,
    device: torch.device,
) -> KVCache:
    """The cache of `num_blocks` blocks, allocated, with each of `attention_layers` that keeps a cache (in
    module order: the paged decoder layers in increasing order) bound to its slot's views and its cache
    group (`CacheLayout.group_of`); the others read their source layer's."""
    cache = spec.allocate(num_blocks, device)
    for module, group, slot in _paged_owners(attention_layers, layout):
        module.bind_kv_cache(replace(cache.slot(module.num_kv_heads, module.head_dim, slot), group=group))
    return cache


def _blocks_that_fit(config: Config, block_bytes: int, device: torch.device) -> int:
    if device.type == "cpu":
        return _cpu_blocks_that_fit(config, block_bytes)
    return _gpu_blocks_that_fit(config, block_bytes, device)


def _budget_bytes(config: Config, device: torch.device) -> int:
    """Bytes the caches may take: cpu_kvcache_gb on the CPU; on CUDA gpu_memory_utilization of the device
    besides what is in use (weights, other processes) and the extra peak the warm-up reached (activations)."""
    if device.type == "cpu":
        return int(config.cpu_kvcache_gb * _GIB)
    free, total = torch.cuda.mem_get_info(device)
    stats = torch.cuda.memory_stats(device)
    used_elsewhere = total - free
    warm_up_extra = stats["allocated_bytes.all.peak"] - stats["allocated_bytes.all.current"]
    return max(int(total * config.gpu_memory_utilization - used_elsewhere - warm_up_extra), 0)


def _cpu_blocks_that_fit(config: Config, block_bytes: int) -> int:
    """The blocks cpu_kvcache_gb holds; ValueError when the part of them sequences can use exceeds the
    memory's share for the cache."""
    num_blocks = _budget_bytes(config, torch.device("cpu")) // block_bytes
    _check_cpu_cache_bytes(config, min(num_blocks, most_blocks_used(config)) * block_bytes)
    return num_blocks


def _check_cpu_cache_bytes(config: Config, cache_bytes: int) -> None:
    """ValueError when a CPU cache of `cache_bytes` exceeds the memory's share for the cache."""
    available = available_memory_bytes()
    allowed = _CPU_KV_CACHE_SHARE * available
    if cache_bytes > allowed:
        raise ValueError(
            f"a {cache_bytes / _GIB:.3g} GiB KV cache (cpu_kvcache_gb={config.cpu_kvcache_gb}) does not fit in "
            f"memory: {available / _GIB:.3g} GiB is available and the cache may take at most "
            f"{_CPU_KV_CACHE_SHARE:.0%} of it ({allowed / _GIB:.3g} GiB), leaving the rest for activations; "
            f"lower cpu_kvcache_gb (or set num_kvcache_blocks)"
        )


def _gpu_blocks_that_fit(config: Config, block_bytes: int, device: torch.device) -> int:
    """The blocks the budget on the device holds (`_budget_bytes`); ValueError when not even one does."""
    budget = _budget_bytes(config, device)
    if budget < block_bytes:
        total = torch.cuda.mem_get_info(device)[1]
        raise ValueError(
            f"no room for the KV cache: one block needs {block_bytes / _GIB:.3f} GiB but only "
            f"{budget / _GIB:.3f} GiB is left of gpu_memory_utilization="
            f"{config.gpu_memory_utilization} x {total / _GIB:.1f} GiB; raise "
            f"gpu_memory_utilization, or lower max_model_len/max_num_batched_tokens"
        )
    return budget // block_bytes
