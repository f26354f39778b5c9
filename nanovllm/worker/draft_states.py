"""Per-position recurrent states of steps with drafts (speculative decoding on a model with recurrent layers),
and the copy that keeps, for each request, the state after its last kept token.

A recurrent layer updates a sequence's state in place, so a step whose
drafts may be rejected must not leave the state after its last draft in the
live slot. Per state group and state of the `StateCacheSpec`, one tensor
`[layers, max_num_seqs, queries, *shape]` (queries = num_speculative_tokens +
1) holds the state after each query of each row of the step: a verify step
writes it instead of the live slots, a varlen step besides them
(`RecurrentLayer` states the contract). Once the drafts are checked, `keep`
copies row r's state after query kept[r] (its kept drafts: the query of its
last emitted token) to its live slot, one gather and one scatter per tensor
on the device, no host sync.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nanovllm.layers.recurrent_state import RecurrentLayer
from nanovllm.worker.state_cache import StateCache, StateCacheSpec


@dataclass(frozen=True, eq=False)
class DraftStates:
    """One rank's per-position states: `tensors[g][i]` is state i of group g, [layers, max_num_seqs, queries,
    *shape], the layout of the state cache's `tensors[g][i]` but for the slot dimension."""

    spec: StateCacheSpec
    tensors: tuple[tuple[torch.Tensor, ...], ...]

    @classmethod
    def allocate(
        cls, spec: StateCacheSpec, max_num_seqs: int, queries: int, device: torch.device | str
    ) -> "DraftStates":
        """Per-position states for steps of up to `max_num_seqs` rows of `queries` queries (uninitialised: a
        row is written before it is read)."""
        return cls(spec, spec.tensors((max_num_seqs, queries), device))

    def bind(self, modules: Sequence[RecurrentLayer]) -> None:
        """Hand each of `modules` (in module order: the recurrent layers in increasing order) its views."""
        for module, views in zip(modules, self.spec.layer_views(self.tensors), strict=True):
            module.bind_draft_states(views)

    def keep(self, live: StateCache, rows: torch.Tensor, kept: torch.Tensor, slots: torch.Tensor) -> None:
        """Each live slot `slots[i]` takes the state of row `rows[i]` after its query `kept[i]`: the state after
        the request's last kept token. Queued without waiting (a CUDA graph may capture it)."""
        # rows, kept, slots: [n] int64
        for states, steps in zip(live.tensors, self.tensors):
            for t, step in zip(states, steps):
                t.index_copy_(1, slots, step[:, rows, kept])  # [layers, n, *shape] into the slots
