"""Chooses which sequences run each step: prefill first, decode otherwise, preempting when blocks run out."""

from collections import deque
from dataclasses import dataclass

from nanovllm.config import Config
from nanovllm.engine.block_manager import BlockManager
from nanovllm.engine.sequence import Sequence, SequenceStatus
from nanovllm.engine.stop_checker import StopChecker


@dataclass
class ScheduledBatch:
    """What the scheduler decided for one step."""

    seqs: list[Sequence]
    is_prefill: bool


class Scheduler:
    """Keeps the waiting and running queues and the block manager in step."""

    def __init__(self, config: Config):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
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
        seqs = self._schedule_prefill()
        if seqs:
            return ScheduledBatch(seqs, is_prefill=True)
        seqs = self._schedule_decode()
        assert seqs, "running sequences exist but none could be scheduled"
        return ScheduledBatch(seqs, is_prefill=False)

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        num_batched_tokens = 0
        while self.waiting and len(scheduled) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.block_manager.cached_prefix(seq)
            num_new_tokens = seq.num_tokens - len(hits) * self.block_manager.block_size
            if (num_batched_tokens + num_new_tokens > self.max_num_batched_tokens
                    or not self.block_manager.can_allocate(seq, hits)):
                break
            self.block_manager.allocate(seq, hits)
            num_batched_tokens += num_new_tokens
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            self.running.append(seq)
            scheduled.append(seq)
        return scheduled

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        while self.running and len(scheduled) < self.max_num_seqs:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                scheduled.append(seq)
        self.running.extendleft(reversed(scheduled))
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        # Recompute later: the completion so far becomes part of the next prefill.
        seq.status = SequenceStatus.WAITING
        self.block_manager.deallocate(seq)
        self.waiting.appendleft(seq)

    def postprocess(self, seqs: list[Sequence], token_ids: list[int],
                    logprobs: list[dict[int, float] | None] | None = None) -> None:
        """Record each sampled token (and its logprobs); finish and free the sequences that are done."""
        for i, (seq, token_id) in enumerate(zip(seqs, token_ids)):
            seq.num_computed_tokens = seq.num_tokens
            seq.append_token(token_id)
            if logprobs is not None and logprobs[i] is not None:
                seq.logprobs.append(logprobs[i])
            self.stop_checker.update(seq)
            if seq.finish_reason is not None:
                seq.status = SequenceStatus.FINISHED
                self.block_manager.deallocate(seq)
                self.running.remove(seq)
