"""Drafts of speculative method "mtp": the target checkpoint's multi-token-prediction layer run inside the
target's runner, right after each step's sampling, on the step's own hidden states.

The MTP layer at position t reads the token after t and the decoder's hidden
state at t (`models/mtp.py`), and its attention reads its own K/V at the
earlier positions: it runs at every position a step computes, prompt chunks
included, so its K/V, kept as one more full-attention layer in the target's
blocks (`ModelConfig.cache_specs`), is there for every later draft and for the
prefix cache, and goes with the blocks on preemption. The token after each
position is the next one in the step where the step holds it, the next prompt
token after a chunk that stops short of its prompt's end
(`SchedulerOutput.next_token_ids`), and for a request that sampled, the token
it emitted last, at the position of its last kept token: positions past it
(rejected drafts) get K/V that the steps after overwrite, as they compute those
positions again. The layer's output at that last kept position gives the first
draft (its argmax); each further draft runs the layer one position on, on the
draft before and the layer's own output, writing K/V at positions that the
request's next step computes again (the scheduler holds blocks for them:
`KVCacheManager` lookahead).

Drafts are greedy, point masses, so the target's check keeps its output
distribution exact (`spec_decode/verification.py`).
"""

from dataclasses import dataclass

import torch

from nanovllm.core.scheduler_output import PLACEHOLDER, SchedulerOutput
from nanovllm.spec_decode.verification import ToDevice
from nanovllm.utils.context import Context, forward_context
from nanovllm.worker.decode_step import resolve_placeholders
from nanovllm.worker.varlen_inputs import varlen_inputs


@dataclass
class StepTokens:
    """A varlen step's tokens as the MTP layer reads them: the attention context, the resolved input ids
    and positions ([tokens] each), the decoder's hidden states ([tokens, hidden]) and `cu_q`."""

    context: Context
    input_ids: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor
    cu_q: list[int]


class MTPDrafter:
    """Runs the model's MTP layer over a step's tokens and drafts `num_speculative_tokens` tokens after each
    sampling request's last emitted one (greedy). Positions at or past `context_len` are never drafted for."""

    def __init__(
        self,
        model: torch.nn.Module,
        num_speculative_tokens: int,
        block_size: int,
        context_len: int,
        new_keys_from_cache: bool,
        to_device: ToDevice,
    ):
        self.model = model
        self.k = num_speculative_tokens
        self.block_size = block_size
        self.context_len = context_len
        self.new_keys_from_cache = new_keys_from_cache
        self.to_device = to_device

    def draft(
        self, out: SchedulerOutput, step: StepTokens, last_ids: torch.Tensor | None, num_emitted: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The MTP layer's K/V at every token of the step, and each sampling request's drafts, [requests, k]
        int64 (-1 past a request's last draft); None where no request sampled. `last_ids`, `num_emitted`:
        [sampling requests], the last token each emitted and how many (the drafts it kept + 1; None: one)."""
        ends = [end - 1 for end in step.cu_q[1:]]
        # the token after each position: the next one of the step (a junk one at each request's last)
        next_ids = step.input_ids.roll(-1)  # [tokens]
        # after a chunk that stops short of its prompt's end, the next prompt token (start-up steps, which
        # name none, all sample)
        following = out.next_token_ids or [PLACEHOLDER] * len(ends)
        known = [(end, token) for end, token, samples in zip(ends, following, out.samples) if not samples]
        if known:
            rows, tokens = zip(*known)
            assert PLACEHOLDER not in tokens, "a chunk short of its prompt's end is followed by a known token"
            next_ids[self.to_device(rows, torch.int64)] = self.to_device(tokens, torch.int64)
        sampling = [i for i, samples in enumerate(out.samples) if samples]
        kept = None
        if sampling:
            # each sampling request's last kept token: its chunk's last, less the drafts it rejected
            drafts = out.draft_token_ids or [[]] * len(sampling)
            first_draft = self.to_device([ends[i] - len(d) for i, d in zip(sampling, drafts)], torch.int64)
            kept = first_draft if num_emitted is None else first_draft + num_emitted - 1  # [requests]
            next_ids[kept] = last_ids
        with forward_context(step.context):
            hidden = self.model.forward_mtp(next_ids, step.hidden, step.positions)  # [tokens, hidden]
        if kept is None:
            return None
        return self._decode_on(out, sampling, hidden[kept], step.positions[kept])

    def _decode_on(
        self, out: SchedulerOutput, sampling: list[int], hidden: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The drafts after each sampling request's last kept token, from the MTP layer's output there
        (`hidden`, [requests, hidden], which each further draft replaces by the layer's output one position on)
        at `positions` ([requests])."""
        drafts = torch.full((len(sampling), self.k), -1, dtype=torch.int64, device=hidden.device)
        drafts[:, 0] = self.model.compute_logits(hidden).argmax(dim=-1)
        if self.k == 1:
            return drafts
        # further drafts need each request's position on the host, for the attention's lengths and slots: the
        # one wait of the step for the device (a step of this method is read back right after anyway)
        starts = positions.tolist()
        rows = list(range(len(sampling)))
        for j in range(1, self.k):
            # a start-up step's requests have no blocks (they store nothing): they draft once
            rows = [r for r in rows if starts[r] + j < self.context_len and all(out.block_tables[sampling[r]])]
            if not rows:
                break
            index = self.to_device(rows, torch.int64)
            chain = SchedulerOutput(
                req_ids=[out.req_ids[sampling[r]] for r in rows],
                token_ids=[[PLACEHOLDER]] * len(rows),
                num_computed_tokens=[starts[r] + j for r in rows],
                block_tables=[out.block_tables[sampling[r]] for r in rows],
            )
            # the previous draft of each row stands in as its input token, from the device
            context, input_ids, src_rows, pos, _ = varlen_inputs(
                chain, list(range(len(rows))), self.block_size, self.new_keys_from_cache, self.to_device
            )
            input_ids = resolve_placeholders(input_ids, src_rows, drafts[index, j - 1])
            with forward_context(context):
                hidden[index] = self.model.forward_mtp(input_ids, hidden[index], pos)
            drafts[index, j] = self.model.compute_logits(hidden[index]).argmax(dim=-1)
        return drafts
