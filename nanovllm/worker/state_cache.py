"""The recurrent layers' state cache: its shapes on one rank (`StateCacheSpec`), its allocation, each layer's
views and the copies between slots (`StateCache`).

Layout: per state group (`CacheLayout.state_groups`) and per state of its
spec, one tensor `[layers, num_slots + 1, *shape]` (shape this rank's share:
its first dimension divided by the tensor-parallel size), so that a
sequence's states sit at the same slot in every layer and one copy per tensor
moves a slot of every layer. Slot `num_slots`, the last, is a scratch slot
that padded decode rows read and write. A layer's views are its row of each of
its group's tensors (`RecurrentLayer` states the contract).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanovllm.cache.layout import CacheLayout
from nanovllm.layers.recurrent_state import RecurrentLayer


@dataclass(frozen=True)
class StateGroupSpec:
    """One state group on one rank: its decoder layers, and per state its shape for one sequence (this rank's
    share) and its dtype."""

    layers: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]

    @property
    def slot_bytes(self) -> int:
        """Bytes one sequence's states take over the group's layers."""
        per_layer = sum(math.prod(shape) * dtype.itemsize for shape, dtype in zip(self.shapes, self.dtypes))
        return len(self.layers) * per_layer


@dataclass(frozen=True)
class StateCacheSpec:
    """What one rank's state cache holds per slot: the states of every state group's layers."""

    groups: tuple[StateGroupSpec, ...]

    @classmethod
    def of(cls, layout: CacheLayout, model_dtype: torch.dtype, world_size: int) -> "StateCacheSpec | None":
        """The spec of `layout`'s state groups on one of `world_size` ranks, states whose dtype is unnamed in
        `model_dtype`; None for a model without recurrent layers. ValueError where `world_size` does not
        divide a state's first dimension."""
        if not layout.has_state:
            return None
        groups = []
        for group in layout.state_groups:
            spec = group.spec
            shapes = tuple(_rank_share(shape, world_size) for shape in spec.shapes)
            dtypes = tuple(model_dtype if name is None else getattr(torch, name) for name in spec.dtypes)
            groups.append(StateGroupSpec(group.layers, shapes, dtypes))
        return cls(tuple(groups))

    @property
    def slot_bytes(self) -> int:
        """Bytes one sequence's states take on this rank, over every recurrent layer."""
        return sum(group.slot_bytes for group in self.groups)

    def allocate(self, num_slots: int, device: torch.device | str) -> "StateCache":
        """The cache of `num_slots` slots and the scratch slot, zeroed."""
        return StateCache(self, num_slots, self.tensors((num_slots + 1,), device, torch.zeros), torch.device(device))

    def tensors(self, rows: tuple[int, ...], device: torch.device | str, make=torch.empty) -> tuple[tuple, ...]:
        """Per group and state, one tensor [layers, *rows, *shape] made by `make` (torch.empty or torch.zeros)."""
        return tuple(
            tuple(
                make(len(group.layers), *rows, *shape, dtype=dtype, device=device)
                for shape, dtype in zip(group.shapes, group.dtypes)
            )
            for group in self.groups
        )

    def layer_views(self, tensors: tuple[tuple[torch.Tensor, ...], ...]) -> list[tuple[torch.Tensor, ...]]:
        """Per recurrent layer, in increasing layer order, its row of each of its group's `tensors` (laid out
        as `tensors` makes them)."""
        places = {layer: (g, j) for g, group in enumerate(self.groups) for j, layer in enumerate(group.layers)}
        return [tuple(t[places[layer][1]] for t in tensors[places[layer][0]]) for layer in sorted(places)]


@dataclass(frozen=True, eq=False)
class StateCache:
    """One rank's allocated states: `tensors[g][i]` is state i of group g, [layers, num_slots + 1, *shape]."""

    spec: StateCacheSpec
    num_slots: int
    tensors: tuple[tuple[torch.Tensor, ...], ...]
    device: torch.device

    @property
    def scratch_slot(self) -> int:
        """The slot padded decode rows read and write: the last, past the `num_slots` the scheduler hands out."""
        return self.num_slots

    @property
    def nbytes(self) -> int:
        """Bytes of every state tensor, the scratch slot included."""
        return sum(t.numel() * t.element_size() for states in self.tensors for t in states)

    def bind(self, modules: Sequence[RecurrentLayer]) -> None:
        """Hand each of `modules` (in module order: the recurrent layers in increasing order) its views;
        ValueError where their number is not that of the recurrent layers."""
        for module, views in zip(modules, self.spec.layer_views(self.tensors), strict=True):
            module.bind_state_cache(views)

    def unbind(self, modules: Sequence[RecurrentLayer]) -> None:
        """Have each of `modules` let its views go (they then run from zero states and store nothing)."""
        for module in modules:
            module.bind_state_cache(None)

    def copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """For each (source, destination) of `pairs`, the destination slot's states of every layer become the
        source slot's (a source of -1: zeros). Every source is read before any destination is written; queued
        without waiting. On CUDA, where no destination is also a source (every step's snapshots, and nearly
        every step's restores), one copy kernel per tensor reads each source once; else one gather and one
        scatter per tensor."""
        on_cuda = self.device.type == "cuda"
        # pinned memory is kept from reuse by PyTorch's caching host allocator until the copy from it has run
        index = torch.tensor(pairs, dtype=torch.int64, pin_memory=on_cuda).to(self.device, non_blocking=True)  # [n, 2]
        if on_cuda and _distinct_slots(pairs):
            from nanovllm.kernels.triton_slot_copy import copy_slots  # Triton is needed on CUDA only

            for states in self.tensors:
                for t in states:
                    copy_slots(t, index)
            return
        sources, destinations = index[:, 0], index[:, 1]
        zeroed = sources < 0  # [n]
        sources = sources.clamp(min=0)
        for states in self.tensors:
            for t in states:
                values = t.index_select(1, sources)  # [layers, n, *shape]
                values.masked_fill_(zeroed.view(1, -1, *(1,) * (t.dim() - 2)), 0)
                t.index_copy_(1, destinations, values)


def _distinct_slots(pairs: list[tuple[int, int]]) -> bool:
    """Whether no destination of `pairs` is also a source, nor any the destination of two."""
    destinations = {d for _, d in pairs}
    return len(destinations) == len(pairs) and destinations.isdisjoint(s for s, _ in pairs)


def _rank_share(shape: tuple[int, ...], world_size: int) -> tuple[int, ...]:
    """`shape` with its first dimension split across `world_size` ranks; ValueError where it does not divide."""
    first, *rest = shape
    if first % world_size:
        raise ValueError(
            f"tensor_parallel_size={world_size} must divide the first dimension of every recurrent state; "
            f"this model has a state of shape {tuple(shape)}; pick a size that divides {first}"
        )
    return (first // world_size, *rest)
