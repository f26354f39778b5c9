"""A decode step's device work, from its input buffers to its sampled ids: what the decode CUDA graphs capture."""

import torch

from nanovllm.layers.fusion import fused_on_cuda
from nanovllm.sample.sampler import sample_with_temperatures
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
    """The positions, cache slots and context lengths of a decode step launched before the drafts of the step
    before it were checked: the queries of a sequence whose first input token is that step's sample in row
    r move back by `num_rejected[r]`, the drafts rejected there (the host scheduled them as if every draft
    would be kept). A query that stores nothing (slot -1) still stores nothing."""
    # positions, slot_mapping, context_lens, src_rows: [size * queries]; block_tables: [size, width];
    # num_rejected: [rows of the step before] -> positions, slot_mapping, context_lens: [size * queries]
    size = block_tables.size(0)
    first = src_rows.view(size, -1)[:, :1]
    shift = torch.where(first >= 0, num_rejected[first.clamp(min=0)], 0)  # [size, 1]
    moved = positions.view(size, -1) - shift
    slots = block_tables.gather(1, moved // block_size) * block_size + moved % block_size
    slots = torch.where(slot_mapping.view(size, -1) >= 0, slots, -1)
    return moved.view(-1), slots.view(-1), (context_lens.view(size, -1) - shift).view(-1)


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
    """One token per row through the model and, with `samples` (one rank, whose LM head gathers
    nothing), the LM head and the common sampling too: argmax at temperature 0, else a Gumbel-max
    draw from the row's seed, each row's id written to `last_sampled[row]`. Captured in a graph, a
    step of greedy or plain-temperature rows is then one replay.

    With `samples` it returns the logits, so that a step that needs the full sampler samples them
    (its ids then overwrite these) and the LM head runs once per step, in a graph or not. They are
    written to `logits` when the runner sets that buffer, [max_num_seqs, vocab]: the graphs share it
    rather than each holding a [rows, vocab] output of its own. Without `samples` it returns the
    hidden states, which the runner scores across the ranks.

    With `num_rejected` (speculative decoding: the drafts each row of the step before rejected, which the
    runner keeps) the step first moves its sequences back by them (`moved_back`), for the host may launch
    it before it knows them; KV blocks are `block_size` tokens."""

    def __init__(
        self, forward: DeviceInputForward, samples: bool, block_size: int, num_rejected: torch.Tensor | None = None
    ):
        self.forward = forward
        self.samples = samples
        self.block_size = block_size
        self.num_rejected = num_rejected
        self.logits: torch.Tensor | None = None

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
        sample: bool = True,
    ) -> torch.Tensor:
        """One step over the decode buffers' views of its shape (`DecodeBuffers.views`); `sample=False`
        skips the temperature sampling where no graph needs it: an eager step that the full sampler samples."""
        # input_ids, src_rows, positions, slot_mapping, context_lens, temperatures, seeds: [rows = size * queries];
        # seq_order: [size]; block_tables: [size, width]
        # -> logits [rows, vocab] with `samples`, else hidden states [rows, hidden]
        if self.num_rejected is not None:
            positions, slot_mapping, context_lens = moved_back(
                positions, slot_mapping, context_lens, block_tables, src_rows, self.num_rejected, self.block_size
            )
        context = Context(
            is_prefill=False,
            slot_mapping=slot_mapping,
            context_lens=context_lens,
            block_tables=block_tables,
            seq_order=seq_order,
            queries_per_seq=input_ids.numel() // seq_order.numel(),
        )
        with forward_context(context):
            hidden_states = self.forward(input_ids, src_rows, positions)
        if not self.samples:
            return hidden_states
        rows = hidden_states.size(0)
        # an eager step larger than every graph (a verify step's queries) gets logits of its own
        out = None if self.logits is None or rows > self.logits.size(0) else self.logits[:rows]
        logits = self.forward.model.compute_logits(hidden_states, out)
        if sample:
            sample_with_temperatures(logits, temperatures, seeds, out=self.forward.last_sampled[:rows])
        return logits
