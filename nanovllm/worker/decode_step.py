"""A decode step's device work, from its input buffers to its sampled ids: what the decode CUDA graphs capture."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanovllm.layers.fusion import fused_on_cuda
from nanovllm.sample.sampler import sample_across_ranks, sample_with_temperatures
from nanovllm.spec_decode.verification import check_padded, drafts_in_step
from nanovllm.utils.context import Context, forward_context


@fused_on_cuda
def resolve_placeholders(input_ids: torch.Tensor, src_rows: torch.Tensor, last_sampled: torch.Tensor) -> torch.Tensor:
    """Each row's token id: its input id, or where `src_rows` >= 0 the previous step's sample in that row
    (one generated kernel on CUDA instead of a compare, a gather and a select)."""
    # input_ids, src_rows: [tokens]; last_sampled: [max_num_seqs] -> [tokens]
    return torch.where(src_rows < 0, input_ids, last_sampled[src_rows])


@fused_on_cuda
def moved_back(
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    src_rows: torch.Tensor,
    num_rejected: torch.Tensor,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The positions, cache slots (of every cache group) and context lengths of a decode step launched before
    the drafts of the step before it were checked: the queries of a sequence whose first input token is that
    step's sample in row r move back by `num_rejected[r]`, the drafts rejected there (the host scheduled them
    as if every draft would be kept). A query that stores nothing (slot -1) still stores nothing."""
    # positions, context_lens, src_rows: [size * queries]; slot_mapping: [groups, size * queries];
    # block_tables: [groups, size, width]; num_rejected: [rows of the step before]
    # -> positions, context_lens: [size * queries]; slot_mapping: [groups, size * queries]
    groups, size = block_tables.shape[:2]
    first = src_rows.view(size, -1)[:, :1]
    shift = torch.where(first >= 0, num_rejected[first.clamp(min=0)], 0)  # [size, 1]
    moved = positions.view(size, -1) - shift  # [size, queries]
    blocks = block_tables.gather(2, (moved // block_size).expand(groups, -1, -1))  # [groups, size, queries]
    slots = blocks * block_size + moved % block_size
    slots = torch.where(slot_mapping.view(groups, size, -1) >= 0, slots, -1)
    return moved.view(-1), slots.view(groups, -1), (context_lens.view(size, -1) - shift).view(-1)


@dataclass
class VerifyOutputs:
    """Where a verify step that samples its own rows (speculative decoding) leaves its check of the drafts:
    every query's sampled id and, per request, the drafts it rejected (by which the step after it moves back,
    `moved_back`) and the tokens it emits. The runner allocates them once; the graphs write them."""

    query_samples: torch.Tensor  # [max_num_seqs * queries] int64
    num_rejected: torch.Tensor  # [max_num_seqs] int64
    num_emitted: torch.Tensor  # [max_num_seqs] int64

    @classmethod
    def allocate(cls, max_num_seqs: int, queries: int, device: torch.device) -> "VerifyOutputs":
        """Zeroed buffers for verify steps of up to `max_num_seqs` requests of `queries` queries."""
        zeros = lambda n: torch.zeros(n, dtype=torch.int64, device=device)
        return cls(zeros(max_num_seqs * queries), zeros(max_num_seqs), zeros(max_num_seqs))


@fused_on_cuda
def check_drafts_in_step(
    query_samples: torch.Tensor,
    input_ids: torch.Tensor,
    slot_mapping: torch.Tensor,
    last_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    num_emitted: torch.Tensor,
) -> None:
    """`check_padded` on a verify step's own inputs (its drafts follow each request's last token; a padding
    query stores nothing), its results written where the step after reads them: each request's last kept
    token in its row of `last_sampled`, its rejected drafts in `num_rejected`, its emitted count in
    `num_emitted` (one generated kernel on CUDA, inside the graph, instead of a dozen launches after it)."""
    # query_samples, input_ids, slot_mapping: [size * queries]; last_sampled, num_rejected, num_emitted: [size]
    drafts = drafts_in_step(input_ids, slot_mapping, num_emitted.size(0))
    emitted, last_token_ids, rejected = check_padded(query_samples, *drafts)
    num_emitted.copy_(emitted)
    last_sampled.copy_(last_token_ids)
    num_rejected.copy_(rejected)


class DeviceInputForward:
    """The model over a step's tokens, each placeholder's id taken from the previous step's samples
    on the device (inside the decode graphs too). Holds no reference to the runner, so that graphs
    capturing it form no cycle that would keep an engine's memory alive after it is dropped."""

    def __init__(self, model: torch.nn.Module, last_sampled: torch.Tensor):
        self.model = model
        self.last_sampled = last_sampled

    def __call__(self, input_ids: torch.Tensor, src_rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, src_rows, positions: [tokens] -> hidden states [tokens, hidden]
        return self.model(resolve_placeholders(input_ids, src_rows, self.last_sampled), positions)


class DecodeStep:
    """One token per row through the model and, with `samples`, the LM head and the common sampling
    too: argmax at temperature 0, else a Gumbel-max draw from the row's seed, each row's id written to
    `last_sampled[row]`. Captured in a graph, a step of greedy or plain-temperature rows is then one
    replay. With several ranks (`vocab_slice`: the first token id of this rank's slice of the logits,
    and the vocabulary's size) every rank draws from its slice and the ranks agree on the best draw
    (`sample_across_ranks`), so that every rank has the step's ids.

    With `samples` it returns the logits (this rank's slice), so that a step that needs the full
    sampler samples them (its ids then overwrite these) and the LM head runs once per step, in a graph
    or not. They are written to `logits` when the runner sets that buffer, [max_num_seqs, vocab /
    ranks]: the graphs share it rather than each holding a [rows, vocab] output of its own. Without
    `samples` it returns the hidden states, which the runner scores across the ranks.

    With `verify` (speculative decoding) the step first moves its sequences back by the drafts each row of
    the step before rejected (`moved_back`), for the host may launch it before it knows them; KV blocks are
    `block_size` tokens. A verify step (several queries per sequence) that samples writes its queries' ids
    to `verify.query_samples` and checks its drafts itself (`check_drafts_in_step`): each request's last
    kept token goes to its row of `last_sampled`. On a model with recurrent layers, `keep_states` (set by the
    runner) then gives each sequence's live state slot its state after its last kept query (`DraftStates.keep`,
    here with the graph)."""

    def __init__(
        self,
        forward: DeviceInputForward,
        samples: bool,
        block_size: int,
        verify: VerifyOutputs | None = None,
        vocab_slice: tuple[int, int] | None = None,
    ):
        self.forward = forward
        self.samples = samples
        self.vocab_slice = vocab_slice
        self.block_size = block_size
        self.verify = verify
        self.logits: torch.Tensor | None = None
        # (rows, kept queries, live slots) [n] each -> None: None on a model without recurrent state
        self.keep_states: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None

    def __call__(
        self,
        input_ids: torch.Tensor,
        src_rows: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        temperatures: torch.Tensor,
        seeds: torch.Tensor,
        seq_order: torch.Tensor,
        block_tables: torch.Tensor,
        state_slots: torch.Tensor | None = None,
        sample: bool = True,
    ) -> torch.Tensor:
        """One step over the decode buffers' views of its shape (`DecodeBuffers.views`); `sample=False`
        skips the temperature sampling where no graph needs it: an eager step that the full sampler samples."""
        # input_ids, src_rows, positions, context_lens, temperatures, seeds: [rows = size * queries];
        # slot_mapping: [groups, rows]; seq_order: [size]; block_tables: [groups, size, width];
        # state_slots: [size] or None (no recurrent state)
        # -> logits [rows, vocab] with `samples`, else hidden states [rows, hidden]
        if self.verify is not None:
            positions, slot_mapping, context_lens = moved_back(
                positions, slot_mapping, context_lens, block_tables, src_rows, self.verify.num_rejected, self.block_size
            )
        context = Context(
            is_prefill=False,
            slot_mapping=slot_mapping[0],
            context_lens=context_lens,
            block_tables=block_tables[0],
            seq_order=seq_order,
            queries_per_seq=input_ids.numel() // seq_order.numel(),
            state_slots=state_slots,
        ).with_groups(slot_mapping, block_tables)
        with forward_context(context):
            hidden_states = self.forward(input_ids, src_rows, positions)
        if not self.samples:
            return hidden_states
        rows = hidden_states.size(0)
        # an eager step larger than every graph (a verify step's queries) gets logits of its own
        out = None if self.logits is None or rows > self.logits.size(0) else self.logits[:rows]
        logits = self.forward.model.compute_local_logits(hidden_states, out)
        if sample and rows > seq_order.numel():
            # group 0's slots tell a padding query (-1) as well as any group's
            self._sample_and_check(logits, temperatures, seeds, input_ids, slot_mapping[0], seq_order.numel())
            if self.keep_states is not None:
                num_emitted = self.verify.num_emitted[: seq_order.numel()]
                self.keep_states(
                    torch.arange(num_emitted.numel(), device=num_emitted.device), num_emitted - 1, state_slots
                )
        elif sample:
            self._draw(logits, temperatures, seeds, self.forward.last_sampled[:rows])
        return logits

    def _draw(self, logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor, out: torch.Tensor) -> None:
        # logits: [rows, vocab / ranks]; temperatures, seeds, out: [rows]
        if self.vocab_slice is None:
            sample_with_temperatures(logits, temperatures, seeds, out=out)
        else:
            sample_across_ranks(logits, temperatures, seeds, out, *self.vocab_slice)

    def _sample_and_check(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        seeds: torch.Tensor,
        input_ids: torch.Tensor,
        slot_mapping: torch.Tensor,
        size: int,
    ) -> None:
        """A verify step's sampling: every query's id, then the check of the drafts against them."""
        # logits: [size * queries, vocab]; temperatures, seeds, input_ids, slot_mapping: [size * queries]
        query_samples = self.verify.query_samples[: logits.size(0)]
        self._draw(logits, temperatures, seeds, query_samples)
        check_drafts_in_step(
            query_samples,
            input_ids,
            slot_mapping,
            self.forward.last_sampled[:size],
            self.verify.num_rejected[:size],
            self.verify.num_emitted[:size],
        )
