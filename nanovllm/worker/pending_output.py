"""The handle that waits for a launched step's outputs on their way to the host."""

from dataclasses import dataclass

import torch

from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler_output import PromptScoring
from nanovllm.engine.messages import TokenLogprobs
from nanovllm.sample.sampler import SamplerOutput
from nanovllm.spec_decode.verification import VerifiedDrafts


@dataclass
class PromptScores:
    """The scored prompt positions of one step, all jobs' rows one after another, on the device."""

    jobs: list[PromptScoring]
    token_ids: torch.Tensor  # [rows, 1 + k]: the actual next token, then the top k
    logprobs: torch.Tensor  # [rows, 1 + k]
    ranks: torch.Tensor  # [rows]


def _entries(
    ids: list[list[int]], values: list[list[float]], ranks: list[int], counts: list[int | None]
) -> list[TokenLogprobs | None]:
    """One TokenLogprobs per row, cut to the row's own number of alternatives (None: no entry)."""
    return [
        None if k is None else TokenLogprobs(row_ids[: 1 + k], row_values[: 1 + k], rank)
        for k, row_ids, row_values, rank in zip(counts, ids, values, ranks)
    ]


class PendingOutput:
    """A launched step's sampler outputs on their way to the host.

    The copies to (pinned) host memory are queued behind the step on its stream
    and an event marks their end, so `result()` waits for this step alone and
    never for work launched after it. The copies are made at once (on the CPU
    too), so later steps may overwrite the tensors they came from, as each
    step does `last_sampled`. `logprob_counts` holds each sampling row's number
    of logprob alternatives; `verified` says, in a step with drafts, which rows
    each request emits (else each request has one row, which it emits);
    `drafts`, [sampling requests, k] (-1 past a request's last), the drafts made
    beside the step (method "mtp").
    """

    def __init__(
        self,
        sampled: SamplerOutput | None,
        logprob_counts: list[int | None],
        prompt_scores: PromptScores | None = None,
        verified: VerifiedDrafts | None = None,
        drafts: torch.Tensor | None = None,
    ):
        host = lambda t: None if t is None else t.to("cpu", non_blocking=True, copy=True)
        self._token_ids = host(sampled.token_ids) if sampled is not None else None
        self._emitted = None if verified is None else (verified.row_starts, host(verified.num_emitted))
        self._logprobs = None
        if sampled is not None and sampled.logprobs is not None:
            self._logprobs = (host(sampled.logprob_token_ids), host(sampled.logprobs), host(sampled.ranks))
        self._drafts = host(drafts)
        self._logprob_counts = logprob_counts
        self._prompt = None
        if prompt_scores is not None:
            self._prompt = (
                prompt_scores.jobs,
                host(prompt_scores.token_ids),
                host(prompt_scores.logprobs),
                host(prompt_scores.ranks),
            )
        self._event = None
        if (sampled.token_ids if sampled is not None else prompt_scores.token_ids).is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self) -> ModelRunnerOutput:
        """Wait for the copies, then the token ids and logprobs as Python values, per request."""
        if self._event is not None:
            self._event.synchronize()
        token_ids = [] if self._token_ids is None else self._token_ids.tolist()
        logprobs = None
        if self._logprobs is not None:
            ids, values, ranks = (t.tolist() for t in self._logprobs)
            logprobs = _entries(ids, values, ranks, self._logprob_counts)
        if self._emitted is None:
            runs = [slice(row, row + 1) for row in range(len(token_ids))]
        else:
            starts, num_emitted = self._emitted
            runs = [slice(start, start + n) for start, n in zip(starts, num_emitted.tolist())]
        return ModelRunnerOutput(
            [token_ids[run] for run in runs],
            None if logprobs is None else [None if logprobs[run.start] is None else logprobs[run] for run in runs],
            self._prompt_logprobs(),
            None if self._drafts is None else [[t for t in row if t >= 0] for row in self._drafts.tolist()],
        )

    def _prompt_logprobs(self) -> dict[str, list[TokenLogprobs]]:
        if self._prompt is None:
            return {}
        jobs, ids, values, ranks = self._prompt
        ids, values, ranks = ids.tolist(), values.tolist(), ranks.tolist()
        scores, row = {}, 0
        for job in jobs:
            n = len(job.target_ids)
            scores[job.request_id] = _entries(
                ids[row : row + n], values[row : row + n], ranks[row : row + n], [job.num_logprobs] * n
            )
            row += n
        return scores
