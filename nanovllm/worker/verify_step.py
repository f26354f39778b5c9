"""The runner's part in steps with drafts (speculative decoding): the check of the drafts and what the step
after it learns from it.

A step with drafts samples each drafting request at every draft's position
and after the last. Where every request decodes its last token and its drafts,
the step is a verify step: a decode step of `queries` = num_speculative_tokens
+ 1 queries per request (padded), whose rows each take `queries` sampling rows.
A verify step that samples its own rows checks its drafts on the device, in its
CUDA graph (`DecodeStep`, `VerifyOutputs`); any other step with drafts is
checked once the full sampler has drawn (`VerifyStep.check`). Either way each
request's last kept token lands in its row of `last_sampled`, and the drafts it
rejected in `outputs.num_rejected`, by which the next decode step, launched
before the check is read back, moves back (`Scheduler.verify_ahead`).
"""

import torch
import torch.distributed as dist

from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.spec_decode.verification import (
    ToDevice,
    VerifiedDrafts,
    drafts_in_step,
    first_sampling_rows,
    verify_drafts,
    verify_padded,
)
from nanovllm.worker.decode_buffers import DecodeBuffers
from nanovllm.worker.decode_step import VerifyOutputs


class VerifyStep:
    """The check of the drafts of each step that has them, on a rank whose `last_sampled` ([max sampling
    rows]) holds the latest step's samples. `outputs` is where the latest verify step's check lies; its
    `num_rejected` ([max_num_seqs]) stays true of the latest step launched: its counts after a step with
    drafts (rank 0's, sent to the other ranks), zeros after a step without."""

    def __init__(
        self,
        num_speculative_tokens: int,
        max_num_seqs: int,
        last_sampled: torch.Tensor,
        world_size: int,
        device: torch.device,
    ):
        self.queries = 1 + num_speculative_tokens  # the last token and as many drafts as the method proposes
        self.outputs = VerifyOutputs.allocate(max_num_seqs, self.queries, device)
        self.last_sampled = last_sampled
        self.world_size = world_size
        self._rejections_pending = False  # num_rejected holds a step's counts

    def drafts_on_device(
        self, buffers: DecodeBuffers, size: int, num_requests: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafts of the verify step of `size` (padded) sequences just loaded, as the decode buffers hold
        them on the device: the ids after each request's last token and which of them are drafts (a padding
        query stores nothing), [num_requests, queries - 1] each."""
        input_ids, _, _, slots, *_ = buffers.views(size, self.queries)
        draft_ids, is_draft = drafts_in_step(input_ids, slots[0], size)  # group 0's slots tell the padding
        return draft_ids[:num_requests], is_draft[:num_requests]

    def check(
        self,
        sampled: torch.Tensor,
        out: SchedulerOutput,
        drafts_on_device: tuple[torch.Tensor, torch.Tensor] | None,
        to_device: ToDevice,
    ) -> VerifiedDrafts:
        """The drafts checked against the ids the sampler drew at their positions (`sampled`, [sampling rows]),
        and each request's last kept token put in `last_sampled` (its row there is the request's, as in a
        step without drafts). `drafts_on_device`: a verify step's drafts (`drafts_on_device`), else None."""
        if drafts_on_device is not None:
            verified = verify_padded(sampled, *drafts_on_device)
        else:
            verified = verify_drafts(sampled, out.draft_token_ids, to_device)
        self.last_sampled[: verified.last_token_ids.numel()].copy_(verified.last_token_ids)
        self.outputs.num_rejected[: verified.num_rejected.numel()].copy_(verified.num_rejected)
        return verified

    def checked_in_step(self, out: SchedulerOutput, rows: int) -> tuple[torch.Tensor, VerifiedDrafts]:
        """A verify step's check that the step made itself: its queries' sampled ids ([rows]), and what each
        request keeps."""
        n = len(out.req_ids)
        verified = VerifiedDrafts(
            first_sampling_rows(out.draft_token_ids, self.queries),
            self.outputs.num_emitted[:n],
            self.last_sampled[:n],
            self.outputs.num_rejected[:n],
        )
        return self.outputs.query_samples[:rows], verified

    def share_rejections(self, out: SchedulerOutput, checked_on_every_rank: bool) -> None:
        """Keep `num_rejected` true of the step just launched: a step's counts (rank 0 wrote them and the other
        ranks get them, unless every rank checked the drafts in the decode step), or zeros after a step without
        drafts."""
        num_rejected = self.outputs.num_rejected
        if out.draft_token_ids is not None:
            if self.world_size > 1 and not checked_on_every_rank:
                dist.broadcast(num_rejected[: len(out.sampled_req_ids)], src=0)
            self._rejections_pending = True
        elif self._rejections_pending:
            num_rejected.zero_()
            self._rejections_pending = False
