"""What cache each decoder layer needs: one hashable spec per layer (`ModelConfig.layer_specs`).

FullAttention      paged K/V blocks over every token of the sequence
SlidingWindow      paged K/V blocks of which only the last `window` tokens are read
RecurrentState     a fixed-size state per sequence, updated in place at each token
SharedKV           no cache of its own: the layer reads another layer's K/V

Layers with equal specs form a group (`group_layers`), which the engine gives
one pool of blocks or of state slots. Sizes are the whole model's, before a
tensor-parallel split: the worker divides the heads (or a state's first
dimension) by the number of ranks.

This module sits below `models/` (whose config builds the specs), `layers/`
(which run on the cache view they are handed) and `worker/` (which sizes and
binds the caches): `models/` imports `layers/`, and `worker/` imports both, so a
spec type in any of them would make a lower tier import a higher one. It imports
nothing of nanovllm, nor torch: dtypes are named as torch names them.
"""

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FullAttention:
    """K and V of every token of the sequence, in paged blocks: each block holds block_size tokens of
    [num_kv_heads, head_dim] keys and as many values."""

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SlidingWindow:
    """K and V in paged blocks as for FullAttention, of which a query at position p reads only positions
    p - window + 1 .. p: a block that lies wholly before the window of the sequence's next token is never
    read again."""

    num_kv_heads: int
    head_dim: int
    window: int


@dataclass(frozen=True)
class RecurrentState:
    """States of a fixed size per sequence, which the layer updates in place at each token and so holds one
    of per running request, whatever its length. State i is `shapes[i]` for one sequence, in dtype
    `dtypes[i]` (torch's name; None: the model's dtype); its first dimension (heads, or a convolution's
    channels) is split across tensor-parallel ranks.

    Gated DeltaNet, for example, keeps two: the last kernel_size - 1 inputs of its short convolution,
    [conv_channels, kernel_size - 1] in the model's dtype, and the recurrent state, [heads, k_dim, v_dim]
    in float32."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str | None, ...]

    def __post_init__(self):
        assert len(self.shapes) == len(self.dtypes), "one dtype per state"


@dataclass(frozen=True)
class SharedKV:
    """No cache of its own: the layer attends over the K and V that layer `source_layer` (an earlier one)
    stored, as the last layers of Gemma 3n and of Gemma 4's small models do."""

    source_layer: int


CacheSpec = FullAttention | SlidingWindow | RecurrentState | SharedKV


def group_layers(specs: Sequence[CacheSpec]) -> dict[CacheSpec, tuple[int, ...]]:
    """The indices of the layers of each distinct spec in `specs` (one per layer), the groups in the order
    of their first layer."""
    groups: dict[CacheSpec, list[int]] = {}
    for layer, spec in enumerate(specs):
        groups.setdefault(spec, []).append(layer)
    return {spec: tuple(layers) for spec, layers in groups.items()}
