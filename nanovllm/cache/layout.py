"""How the paged layers share one pool of KV blocks: cache groups, each with its own block table.

Every block of the pool has the same size, so that a block freed by one kind of
layer can hold another kind's tokens: one block is `block_size` tokens of K and V
for the layers of one cache group. The paged layers of one spec
(`specs.group_layers`) are cut into cache groups that fill a block
(`page_width`: values of K per token a block holds, the same for every group),
so that a group of narrow layers holds more of them than one of wide layers; a
request has one block table per cache group, and layer j of a group keeps its
K/V in slot j of the group's blocks. The page is the smallest spec's layers
together (or the widest layer, where one is wider), so a model whose layers are
all alike has one group and one table, and Gemma 3 (5 full-attention layers, 29
sliding ones, all of one shape) has one full group of 5 layers and 6 sliding
groups (the last of 4 layers, so a fifth of its blocks' room is unused).
Gemma-4-31B's 10 global layers of 4 heads of 512 and 50 sliding ones of 16
heads of 256 make one global group of 10 and ten sliding groups of 5.

A sliding group's block table holds -1 where a block lies wholly before the
window of every query the request may still run: those blocks went back to the
pool (`CacheGroup.first_kept_position`).

Recurrent-state layers keep no blocks but state slots: every recurrent layer
has its states of slot s for the same sequence (`state_groups`, one per
spec, for the tensors of its layers). Shared-KV layers keep nothing.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from nanovllm.cache.specs import CacheSpec, FullAttention, RecurrentState, SlidingWindow, group_layers

PagedSpec = FullAttention | SlidingWindow


@dataclass(frozen=True)
class CacheGroup:
    """Paged layers of one spec that share a block table: `layers` are decoder-layer indices, the j-th of them
    in slot j of each block."""

    spec: PagedSpec
    layers: tuple[int, ...]

    @property
    def window(self) -> int | None:
        """The sliding window of the group's layers (None: they read every token)."""
        return self.spec.window if isinstance(self.spec, SlidingWindow) else None

    def first_kept_position(self, num_computed: int, lookback: int) -> int:
        """The first position whose K/V the group must keep while a request's next step computes from position
        `num_computed` on: the window of that step's first query, `lookback` positions earlier still (a
        step launched before its predecessor's drafts were checked may move back by that many), or 0 for a
        group that reads every token."""
        if self.window is None:
            return 0
        return max(0, num_computed - self.window + 1 - lookback)

    def blocks_held(self, num_tokens: int, block_size: int, lookback: int, chunk: int = 1) -> int:
        """The most blocks a request of up to `num_tokens` tokens holds in this group, when its steps compute
        at most `chunk` tokens each (1: once it decodes)."""
        every = (num_tokens + block_size - 1) // block_size
        if self.window is None:
            return every
        return min(every, self.window_blocks(block_size, lookback, chunk))

    def window_blocks(self, block_size: int, lookback: int, chunk: int = 1) -> int:
        """The most blocks a request holds in this sliding group however long it grows, when its steps
        compute at most `chunk` tokens each."""
        # a step from position p on reads p - window + 1 - lookback onwards and writes up to p + chunk - 1
        span = self.window - 1 + lookback + chunk
        return (span + block_size - 1) // block_size + 1


@dataclass(frozen=True)
class StateGroup:
    """Recurrent layers of one spec: `layers` are decoder-layer indices, whose states of one sequence all sit
    in the same slot."""

    spec: RecurrentState
    layers: tuple[int, ...]


@dataclass(frozen=True)
class CacheLayout:
    """The paged layers' cache groups (in the order of their first layer), the room a block has, and the
    recurrent layers' state groups."""

    groups: tuple[CacheGroup, ...]
    page_width: int  # values of K (and as many of V) per token a block holds, over its group's layers
    state_groups: tuple[StateGroup, ...] = ()

    @property
    def has_state(self) -> bool:
        """Whether some layer keeps a recurrent state, and so each running sequence a state slot."""
        return bool(self.state_groups)

    def group_of(self, layer: int) -> tuple[int, int]:
        """(cache group, slot in its blocks) of decoder layer `layer`; ValueError for a layer with no blocks."""
        for g, group in enumerate(self.groups):
            if layer in group.layers:
                return g, group.layers.index(layer)
        raise ValueError(f"layer {layer} keeps no paged K/V")

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        """The distinct (KV heads, head_dim) of the paged layers, in the order of their first group."""
        return tuple(dict.fromkeys(_shape(g.spec) for g in self.groups))

    def blocks_held(self, num_tokens: int, block_size: int, lookback: int, chunk: int = 1) -> int:
        """The most blocks a request of up to `num_tokens` tokens holds over every group (`CacheGroup.blocks_held`)."""
        return sum(group.blocks_held(num_tokens, block_size, lookback, chunk) for group in self.groups)

    def longest_request(self, num_blocks: int, block_size: int, lookback: int, chunk: int, most: int) -> int:
        """The most tokens (at most `most`) one request may reach while the pool of `num_blocks` blocks holds
        all it needs, its steps computing up to `chunk` tokens each; 0 when not even a first block fits."""
        low, high = 0, most
        while low < high:
            mid = (low + high + 1) // 2
            if self.blocks_held(mid, block_size, lookback, chunk) <= num_blocks:
                low = mid
            else:
                high = mid - 1
        return low


def cache_layout(specs: Sequence[CacheSpec], full_attention_only: bool = False) -> CacheLayout:
    """The cache groups of the paged layers among `specs` (one per decoder layer). `full_attention_only`
    keeps every token of a sliding layer too (vLLM's disable_hybrid_kv_cache_manager), as a measure of
    what the groups save."""
    paged = {
        spec: layers for spec, layers in group_layers(specs).items() if isinstance(spec, (FullAttention, SlidingWindow))
    }
    if full_attention_only:
        full = dict.fromkeys(FullAttention(*_shape(spec)) for spec in paged)
        paged = {
            spec: tuple(i for i, s in enumerate(specs) if s in paged and _shape(s) == _shape(spec)) for spec in full
        }
    page_width = max(
        max(_width(spec) for spec in paged), min(len(layers) * _width(spec) for spec, layers in paged.items())
    )
    per_block = {spec: page_width // _width(spec) for spec in paged}
    groups = tuple(
        CacheGroup(spec, layers[start : start + per_block[spec]])
        for spec, layers in paged.items()
        for start in range(0, len(layers), per_block[spec])
    )
    states = tuple(
        StateGroup(spec, layers) for spec, layers in group_layers(specs).items() if isinstance(spec, RecurrentState)
    )
    return CacheLayout(groups, page_width, states)


def _shape(spec: PagedSpec) -> tuple[int, int]:
    """The shape of a token's K/V in the layers of `spec`: (KV heads, head_dim)."""
    return spec.num_kv_heads, spec.head_dim


def _width(spec: PagedSpec) -> int:
    """Values of one token's K (or V) in a layer of `spec`."""
    return spec.num_kv_heads * spec.head_dim
