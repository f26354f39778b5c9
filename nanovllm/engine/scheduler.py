"""Chooses which sequences run each step and how many of their tokens, preempting when blocks run out.

With chunked prefill (the default) a step first gives each running sequence
its decode token, then fills what is left of the token budget with prompt
chunks, oldest request first. Without it a step is either a batch of whole
prompts (preferred) or a batch of decodes.
"""

import math
from collections import deque
from dataclasses import dataclass, field

from nanovllm.config import Config
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.stop_checker import StopChecker


@dataclass
class ScheduledBatch:
    """What the scheduler decided for one step.

    `seqs[i]` computes its next `num_scheduled_tokens[i]` tokens (default: all
    it has left); it samples a token only when they reach its end, which
    `samples[i]` records at construction. `is_prefill`
    picks the variable-length path, which runs prompt chunks with any decodes
    of the step as queries of length 1; False means every sequence decodes one
    token, the path CUDA graphs replay.
    """

    seqs: list[Sequence]
    is_prefill: bool
    num_scheduled_tokens: list[int] | None = None
    samples: list[bool] = field(init=False)
    sampled_seqs: list[Sequence] = field(init=False)  # the sequences that sample this step, in batch order

    def __post_init__(self) -> None:
        if self.num_scheduled_tokens is None:
            self.num_scheduled_tokens = [seq.num_new_tokens for seq in self.seqs]
        # per sequence: whether this step reaches its last token, so that it samples the next
        self.samples = [seq.num_computed_tokens + n == seq.num_tokens
                        for seq, n in zip(self.seqs, self.num_scheduled_tokens)]
        self.sampled_seqs = [seq for seq, samples in zip(self.seqs, self.samples) if samples]


class Scheduler:
    """Keeps the waiting and running queues and the block manager in step.

    A running sequence holds blocks for all its tokens. With chunked prefill it
    may still have prompt tokens to compute: it keeps its place in the running
    queue and gets the next chunk from the budget the decodes ahead of it leave.
    """

    def __init__(self, config: Config):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.chunked_prefill = config.enable_chunked_prefill
        self.stop_checker = StopChecker(frozenset(config.eos_token_ids), config.max_model_len)
        self.block_manager = BlockManager(config.num_kvcache_blocks, config.kvcache_block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop an unfinished `seq` from its queue and free its blocks."""
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
        elif seq.status == SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledBatch:
        """Pick this step's batch; never returns an empty one while work remains."""
        batch = self._schedule_mixed() if self.chunked_prefill else self._schedule_prefill_first()
        assert batch.seqs, "sequences are waiting or running but none could be scheduled"
        return batch

    def _schedule_prefill_first(self) -> ScheduledBatch:
        seqs, counts = self._admit(self.max_num_batched_tokens, num_running=0)
        if seqs:
            return ScheduledBatch(seqs, True, counts)
        seqs, counts = self._schedule_running(budget=None)
        return ScheduledBatch(seqs, False, counts)

    def _schedule_mixed(self) -> ScheduledBatch:
        # Decodes first, so that a long prompt only ever takes what they leave of the budget.
        seqs, counts = self._schedule_running(self.max_num_batched_tokens)
        new_seqs, new_counts = self._admit(self.max_num_batched_tokens - sum(counts), num_running=len(seqs))
        seqs, counts = seqs + new_seqs, counts + new_counts
        # A step where every sequence computes exactly its last token is a decode step.
        return ScheduledBatch(seqs, any(seq.num_new_tokens > 1 for seq in seqs), counts)

    def _admit(self, budget: int, num_running: int) -> tuple[list[Sequence], list[int]]:
        """Move waiting sequences to running, in order, while seats, tokens and blocks last.

        Each gets blocks for all its tokens; with chunked prefill the last one
        admitted may compute only the first part of its prompt this step.
        """
        scheduled, counts = [], []
        while self.waiting and num_running + len(scheduled) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            hits = self.block_manager.cached_prefix(seq)
            num_cached = len(hits) * self.block_manager.block_size
            n = seq.num_tokens - num_cached
            if self.chunked_prefill:
                n = min(n, budget)
            if n > budget or not self.block_manager.can_allocate(seq, hits):
                break
            self.block_manager.allocate(seq, hits, num_cached + n)
            budget -= n
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            scheduled.append(seq)
            counts.append(n)
        return scheduled, counts

    def _schedule_running(self, budget: int | None) -> tuple[list[Sequence], list[int]]:
        """Running sequences in order, each with its decode token or its next prompt chunk,
        within `budget` tokens (None: no limit); preempts from the tail when blocks run out."""
        scheduled, counts = [], []
        left = math.inf if budget is None else budget
        block_manager, running = self.block_manager, self.running
        while running and len(scheduled) < self.max_num_seqs and left > 0:
            seq = running.popleft()
            while not block_manager.can_append(seq):
                if running:
                    self._preempt(running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                n = min(seq.num_new_tokens, left)
                block_manager.may_append(seq, seq.num_computed_tokens + n)
                scheduled.append(seq)
                counts.append(n)
                left -= n
        running.extendleft(reversed(scheduled))
        return scheduled, counts

    def _preempt(self, seq: Sequence) -> None:
        # Recompute later: the completion so far becomes part of the next prefill,
        # which starts again from what the prefix cache still holds.
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)

    def postprocess(self, batch: ScheduledBatch, token_ids: list[int],
                    logprobs: list[dict[int, float] | None] | None = None) -> None:
        """Advance each sequence by its scheduled tokens; record the tokens (and logprobs)
        sampled for `batch.sampled_seqs`; finish and free the sequences that are done."""
        sampled = batch.sampled_seqs
        assert len(token_ids) == len(sampled)
        for seq, n in zip(batch.seqs, batch.num_scheduled_tokens):
            seq.num_computed_tokens += n
        for i, (seq, token_id) in enumerate(zip(sampled, token_ids)):
            seq.append_token(token_id)
            if logprobs is not None and logprobs[i] is not None:
                seq.logprobs.append(logprobs[i])
            self.stop_checker.update(seq)
            if seq.finish_reason is not None:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
