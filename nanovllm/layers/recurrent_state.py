"""The mark of a layer that keeps a recurrent state per sequence, and how it gets its states from the worker.

A recurrent layer (Gated DeltaNet, for example) subclasses `RecurrentLayer`;
the worker finds such modules by this class and hands each its states once
they are allocated. The layer never imports the worker: it runs on the views
it is handed and on the step's `Context`.
"""

from abc import ABC, abstractmethod

import torch
from torch import nn


class RecurrentLayer(nn.Module, ABC):
    """A layer whose cache is a fixed-size state per sequence (`cache.specs.RecurrentState`), updated in place.

    The contract with the worker:

    - `bind_state_cache(states)` hands over the layer's states, once allocated:
      state i is a view `[num_state_slots + 1, *shape_i]` of `dtype_i`, where
      shape_i is the spec's `shapes[i]` with its first dimension divided by the
      tensor-parallel size (this rank's share), and dtype_i the torch dtype the
      spec names (None: the model's). Slot `num_state_slots`, the last, is a
      scratch slot: padded decode rows read and write it, and nothing reads it back.
    - Each forward pass reads `get_context().state_slots` ([num_seqs] int64):
      each sequence's live slot in batch order. In a prefill (varlen) step
      there is one per request, whose tokens `cu_seqlens_q` delimits; in a
      decode step one per sequence, padded rows holding the scratch slot. The
      layer starts each sequence from the state in its slot and writes the
      state after the sequence's last token of the step back to that slot.
    - Before binding, and after `bind_state_cache(None)`, the layer runs every
      sequence from a zero state and stores nothing. (The start-up steps that
      measure activations run on a cache of the scratch slot alone, then let it
      go before the caches are sized.)
    - The runner, not the layer, zeroes or restores a new request's live slot
      before a step and copies live states to snapshot slots after it.
    - With speculative decoding, `bind_draft_states(step_states)` also hands
      over per-position states: state i as a view `[max_num_seqs, queries,
      *shape_i]` (queries = num_speculative_tokens + 1). A verify step (a
      decode step of `Context.queries_per_seq` > 1 queries per sequence, the
      sequence's last token and its drafts, padded) runs each sequence's
      queries in order from its live slot, writes the state after query j to
      row (sequence, j) and leaves the live slot as it was. A varlen step also
      writes the state after each of a sequence's first `queries` tokens to
      its row (its place in the step; a shorter sequence's last state past
      its end), besides its live slot. Once the drafts are checked the runner
      copies the state after each request's last kept token to its live slot
      (`worker/draft_states.py`).

    The worker binds these modules, in module order, to the model's recurrent
    layers in increasing layer order (`CacheLayout.state_groups`).
    """

    @abstractmethod
    def bind_state_cache(self, states: tuple[torch.Tensor, ...] | None) -> None:
        """Keep `states`, one view `[num_state_slots + 1, *shape]` per state of the layer's spec, in its order
        (None: let the views kept go)."""

    def bind_draft_states(self, step_states: tuple[torch.Tensor, ...]) -> None:
        """Keep `step_states`, one view `[max_num_seqs, queries, *shape]` per state of the layer's spec, in its
        order, where verify and varlen steps leave their per-position states; a layer that keeps none refuses
        speculative decoding."""
        raise NotImplementedError(f"{type(self).__name__} keeps no per-position states for speculative decoding")
