"""Chooses which requests run each step and how many of their tokens, preempting when blocks run out.

Admission keeps room for the running requests to decode into (`OutputEstimate`),
so that blocks run out only where requests write more than expected.

With chunked prefill (the default) a step first gives each running request
its decode token, then fills what is left of the token budget with prompt
chunks, oldest request first. Without it a step is either a batch of whole
prompts (preferred) or a batch of decodes.

Scheduling runs one step ahead of the host's knowledge: a request that
samples in a launched step counts that token as a placeholder, so the next
step can be scheduled (and its blocks allocated) before the token's value is
read back. `update` then confirms the values, applies the stopping rules and
frees finished requests.

With a proposer (speculative decoding) a running request whose tokens are all
confirmed may get guesses of its next tokens scheduled behind its last one;
`update` confirms those that the step kept and the token sampled after them,
and rolls the rest back, so that their KV slots are written again. Where the
device runs ahead of the host (`verify_ahead`), a request whose drafts are in
flight runs in the next decode step as if every draft will be kept, with new
drafts that guess on from them: the device moves that step's positions back
by the drafts rejected (`DecodeStep`), and `update` does the same on the host.
"""

import logging
import math
from collections import deque

from nanovllm.config import Config
from nanovllm.core.kv_cache_manager import KVCacheManager
from nanovllm.core.output_estimate import OutputEstimate
from nanovllm.core.request import Request, RequestStatus
from nanovllm.core.runner_output import ModelRunnerOutput
from nanovllm.core.scheduler_output import PLACEHOLDER, PromptScoring, SchedulerOutput
from nanovllm.core.stop_checker import StopChecker
from nanovllm.core.structured_output import StructuredOutputs
from nanovllm.engine.messages import EngineCoreOutput, EngineStats
from nanovllm.spec_decode.proposer import Proposer

logger = logging.getLogger(__name__)

# the most steps a request whose drafts keep being rejected proposes nothing for: 1, 3, 7, then 15 steps after
# 1, 2, 3, 4 or more such steps in a row, so that drafts that cost a verify step's compute and keep nothing
# take a sixteenth of its steps at most
_MOST_DRAFT_PAUSE = 15


class Scheduler:
    """Keeps the waiting and running queues and the KV cache manager in step.

    A running request holds blocks for all its tokens (in a sliding-window
    group, for those its window reads). With chunked prefill it
    may still have prompt tokens to compute: it keeps its place in the running
    queue and gets the next chunk from the budget the decodes ahead of it leave.
    `proposer` (None: no speculation) guesses the next tokens of the requests
    that may speculate.
    """

    def __init__(
        self,
        config: Config,
        num_kvcache_blocks: int,
        eos_token_ids: tuple[int, ...],
        structured: StructuredOutputs | None = None,
        proposer: Proposer | None = None,
        num_state_slots: int = 0,
    ):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.token_budget
        self.chunked_prefill = config.enable_chunked_prefill
        self.stop_checker = StopChecker(eos_token_ids, config.context_len)
        # method "mtp": the runner drafts beside each step, from the token after each position it computes
        self.drafts_beside_steps = config.speculative is not None and config.speculative.method == "mtp"
        self.output_estimate = OutputEstimate(config.context_len, config.schedule_conservativeness)
        self.kv_cache = KVCacheManager(
            config.kv_layout,
            num_kvcache_blocks,
            config.kv_block_size,
            config.enable_prefix_caching,
            config.kv_lookback,
            num_state_slots,
            # the MTP layer's further drafts write K/V at up to k - 1 positions past a step's end
            config.speculative.num_speculative_tokens - 1 if self.drafts_beside_steps else 0,
        )
        self.structured = structured or StructuredOutputs(None)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: deque[Request] = deque()
        self.proposer = proposer
        # Whether a request whose drafts are in flight may run in the next (decode) step rather than sit it out.
        # Where launching a step runs it (the CPU) nothing overlaps, and drafts guessed from the step's
        # confirmed tokens are kept more often than those that assume every draft in flight is kept.
        self.verify_ahead = config.device_type == "cuda"
        # Whether a request pauses its proposals after steps whose drafts were all rejected (`_count_drafts`);
        # off, every step that can draft does (which times a verify step itself). Only on a GPU, where a
        # verify step of a few sequences costs more than a decode step; on the CPU it costs about as much, so
        # a pause only loses kept drafts.
        self.pause_fruitless_drafts = config.device_type == "cuda"
        spec = config.speculative
        self.drafting_batch_limit = spec.drafting_batch_limit if spec is not None else None
        self.prefix_cache_queries = self.prefix_cache_hits = self.num_preemptions = 0
        # speculative decoding: request-steps with drafts, drafts checked, drafts kept, and kept per position
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.num_accepted_per_position = [0] * (proposer.num_speculative_tokens if proposer is not None else 0)

    def has_requests(self) -> bool:
        return bool(self.requests)

    def add_request(self, req: Request) -> None:
        """Queue a request; one with structured outputs gets its grammar matcher (ValueError for a spec
        the grammar library refuses)."""
        assert req.request_id not in self.requests, f"request id {req.request_id!r} is already live"
        if req.params.structured_outputs is not None:
            self.structured.add(req.request_id, req.params.structured_outputs)
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_ids: list[str]) -> None:
        """Drop live requests (unknown ids are ignored); a token of theirs still in flight is dropped."""
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is not None:
                self._finish(req, "abort")

    def needs_confirmed_tokens(self) -> bool:
        """Whether the next step's inputs need the values of tokens still in flight: penalties read each
        request's completion on the host, and a proposer that cannot propose ahead (`Proposer.proposes_ahead`)
        reads every token. (A grammar needs them only for its mask, which the engine core fills after it has
        read the step in flight back; a request whose drafts are in flight sits the next step out.)"""
        return any(
            req.num_placeholders
            and (req.params.has_penalties or (self._may_speculate(req) and not self.proposer.proposes_ahead))
            for req in self.running
        )

    def _may_speculate(self, req: Request) -> bool:
        """Whether `req` may get drafts: there is a proposer, and no grammar, penalty or prompt logprobs
        reads its tokens one at a time."""
        params = req.params
        return (
            self.proposer is not None
            and params.structured_outputs is None
            and not params.has_penalties
            and params.prompt_logprobs is None
        )

    def stats(self) -> EngineStats:
        return EngineStats(
            len(self.running),
            len(self.waiting),
            self.kv_cache.usage(),
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.num_preemptions,
            self.num_drafts,
            self.num_draft_tokens,
            self.num_accepted_tokens,
            list(self.num_accepted_per_position),
        )

    def schedule(self) -> SchedulerOutput:
        """Pick the next step. It is empty only when every live request waits for a token in flight."""
        if self.chunked_prefill:
            # Decodes first, so that a long prompt only ever takes what they leave of the budget.
            reqs, counts, passed = self._schedule_running(self.max_num_batched_tokens)
            # a request past its drafts in flight runs in decode steps only, whose positions the device moves
            if not passed:
                new_reqs, new_counts = self._admit(self.max_num_batched_tokens - sum(counts), len(reqs))
                reqs, counts = reqs + new_reqs, counts + new_counts
        else:
            reqs, counts = self._admit(self.max_num_batched_tokens, num_running=0)
            if not reqs:
                reqs, counts, _ = self._schedule_running(budget=None)
        return self._advance(reqs, counts)

    def _admit(self, budget: int, num_running: int) -> tuple[list[Request], list[int]]:
        """Move waiting requests to running, in order, while seats, tokens and blocks last.

        Each gets blocks for all its tokens; with chunked prefill the last one
        admitted may compute only the first part of its prompt this step. Beside
        other running requests, a request is admitted only where the blocks that
        all of them hold as they decode to their expected ends (`OutputEstimate`)
        never outgrow the pool (`KVCacheManager.peak_blocks`).
        """
        scheduled, counts = [], []
        estimating = self.output_estimate.conservativeness > 0
        plans, queued = None, 0  # the running requests' plans (`_decode_plans`), made once a candidate fits
        while self.waiting and num_running + len(scheduled) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            if req.num_placeholders:
                break  # preempted with a token in flight: its recompute waits until that token is known
            # prompt logprobs need the logits of every prompt position: nothing comes from the cache
            kv_cache = self.kv_cache
            hit = kv_cache.no_hit() if req.params.prompt_logprobs is not None else kv_cache.cached_prefix(req)
            if kv_cache.state_on_its_way(req, hit):
                break  # a request admitted now would compute again what this step computes for it
            num_cached = hit.num_tokens
            n = req.num_tokens - num_cached
            if self.chunked_prefill:
                n = min(n, budget)
            n = kv_cache.chunk_end(num_cached, num_cached + n, hit.branch_tokens) - num_cached
            if n > budget or not kv_cache.can_allocate(req, hit, num_cached + n):
                break
            if estimating:
                if plans is None:
                    plans, queued = self._decode_plans()
                queued += req.num_tokens - num_cached
                plans.append(self._decode_plan(req, queued))
                # a request admitted alone runs whatever it is expected to write: the pool holds its longest
                if self.running and kv_cache.peak_blocks(plans) > kv_cache.num_blocks:
                    break
            kv_cache.allocate(req, hit, num_cached + n)
            if req.params.prompt_logprobs is None and kv_cache.enable_prefix_caching:
                self.prefix_cache_queries += req.num_tokens
                self.prefix_cache_hits += num_cached
            budget -= n
            req.status = RequestStatus.RUNNING
            self.waiting.popleft()
            self.running.append(req)
            scheduled.append(req)
            counts.append(n)
        return scheduled, counts

    def _decode_plans(self) -> tuple[list[tuple[int, int, int]], int]:
        """Each running request's (tokens now, tokens at its expected end, steps until then), and the tokens
        that the running requests have still to compute."""
        plans, queued = [], 0
        for req in self.running:
            queued += req.num_tokens - req.num_computed_tokens
            plans.append(self._decode_plan(req, queued))
        return plans, queued

    def _decode_plan(self, req: Request, queued: int) -> tuple[int, int, int]:
        """`req`'s (tokens now, tokens at its expected end, steps until then), where it samples its next token
        in the step that computes the last of the `queued` tokens (those ahead of it and its own uncomputed
        ones, a token budget a step), and a token a step after that."""
        now, end = req.num_tokens, self.output_estimate.final_tokens(req)
        first_step = -(-queued // self.max_num_batched_tokens)
        return now, end, end - now + max(0, first_step - 1)

    def _schedule_running(self, budget: int | None) -> tuple[list[Request], list[int], bool]:
        """Running requests in order, each with its decode token or its next prompt chunk,
        within `budget` tokens (None: no limit); preempts from the tail when blocks run out.
        A request with every token it may have, or with drafts in flight that it may not pass
        (`_passes_drafts`), computes nothing and keeps its place. Also says whether some request
        passed its drafts in flight."""
        scheduled, counts, kept, passed = [], [], [], False
        left = math.inf if budget is None else budget
        kv_cache, running = self.kv_cache, self.running
        decode_only = self._may_pass_drafts()
        proposals = self._propose(decode_only)
        spare = self._spare_blocks() if proposals else 0
        while running and len(scheduled) < self.max_num_seqs and left > 0:
            req = running.popleft()
            # a request whose drafts are in flight sits this step out where it may not pass them: where its
            # next step starts depends on how many are kept (when no other request can run, the step in
            # flight is read back first)
            if req.draft_token_ids and not (decode_only and self._passes_drafts(req)):
                kept.append(req)
                continue
            if self.stop_checker.has_all_tokens(req):
                kept.append(req)
                continue
            if req.draft_token_ids:
                req.pass_drafts_in_flight()
                passed = True
            # drafts only for a request whose own tokens fit: one that must preempt may preempt itself
            if proposals.get(req.request_id) and kv_cache.can_append(req, req.num_computed_tokens + 1):
                drafts, spare = self._drafts_that_fit(req, proposals[req.request_id], left, spare)
                req.add_drafts(drafts)
            start = req.num_computed_tokens
            n = kv_cache.chunk_end(start, start + min(req.num_new_tokens, left), req.branch_tokens) - start
            while not kv_cache.can_append(req, req.num_computed_tokens + n):
                if running:
                    self._preempt(running.pop())
                else:
                    self._preempt(req)
                    break
            else:
                kv_cache.may_append(req, req.num_computed_tokens + n)
                scheduled.append(req)
                counts.append(n)
                kept.append(req)
                left -= n
        running.extendleft(reversed(kept))
        return scheduled, counts, passed

    def _may_pass_drafts(self) -> bool:
        """Whether requests may pass their drafts in flight this step: there are drafts (a proposer), the
        device runs ahead of the host, and the step will be a decode step (no prompt chunk runs and none is
        admitted). Without a proposer no request is looked at."""
        return (
            self.proposer is not None
            and self.verify_ahead
            and (not self.waiting or len(self.running) >= self.max_num_seqs)
            and all(req.num_new_tokens <= 1 for req in self.running)
        )

    def _passes_drafts(self, req: Request) -> bool:
        """Whether `req`, with drafts in flight, runs in the next decode step as if all of them will be kept:
        its draws may not depend on how many tokens it has, which the host does not know then (no seed, whose
        noise follows the position; min_tokens already reached)."""
        params = req.params
        return params.seed is None and len(req.token_ids) - req.num_prompt_tokens >= params.min_tokens

    def _propose(self, decode_only: bool) -> dict[str, list[int]]:
        """Drafts, by request id, for the running requests that may speculate and would compute only their
        last token (confirmed, or with a proposer that proposes ahead still in flight, or in a `decode_only`
        step past drafts in flight, the token after them), at most as many as their max_tokens and the
        model length leave room for after the token sampled behind them; one call to the proposer for all
        of them. Drafts in flight count as kept in what the proposer is shown. None drafts while more requests
        run than `drafting_batch_limit`."""
        if self.proposer is None or len(self.running) > (self.drafting_batch_limit or math.inf):
            return {}
        candidates, room, pending = [], [], []
        most_pending = 1 if self.proposer.proposes_ahead else 0
        for req in self.running:
            if req.draft_token_ids and not (decode_only and self._passes_drafts(req)):
                continue
            unknown = req.num_placeholders - len(req.draft_token_ids)
            if unknown > most_pending or req.num_new_tokens != 1 or not self._may_speculate(req):
                continue
            if req.draft_pause and self.pause_fruitless_drafts:
                req.draft_pause -= 1
                continue
            free = min(
                self.proposer.num_speculative_tokens,
                req.params.max_tokens - req.num_output_tokens - 1,
                self.stop_checker.max_model_len - req.num_tokens - 1,
            )
            if free > 0:
                candidates.append(req)
                # a guess for the token in flight comes first, and is dropped
                room.append(free + unknown)
                pending.append(unknown)
        if not candidates:
            return {}
        drafts = self.proposer.propose(
            [req.token_ids + req.draft_token_ids if req.draft_token_ids else req.token_ids for req in candidates],
            room,
            [req.request_id for req in candidates],
        )
        proposals = {req.request_id: ids[skip:] for req, ids, skip in zip(candidates, drafts, pending)}
        return {request_id: ids for request_id, ids in proposals.items() if ids}

    def _spare_blocks(self) -> int:
        """Free blocks beyond those the running requests need for the tokens they have: what drafts may
        take without making a request wait or be preempted."""
        needed = sum(max(0, self.kv_cache.blocks_needed(req, req.num_tokens)) for req in self.running)
        return self.kv_cache.num_free_blocks - needed

    def _drafts_that_fit(self, req: Request, drafts: list[int], left: float, spare: int) -> tuple[list[int], int]:
        """The leading drafts that fit beside the request's last token in what is left of the step's token
        budget and in its blocks, those it needs anyway and `spare` more; and the spare blocks left after
        them. Drafts never cause a preemption, and stop before a block boundary where the state is snapshotted
        (`_stops_before_state_cut`)."""
        own = max(0, self.kv_cache.blocks_needed(req, req.num_tokens))
        for d in range(int(min(len(drafts), max(0, left - 1))), -1, -1):
            if d and not self._stops_before_state_cut(req, d):
                continue
            extra = self.kv_cache.blocks_needed(req, req.num_tokens + d, req.num_tokens + d) - own
            if extra <= max(spare, 0):
                return drafts[:d], spare - max(extra, 0)
        return [], spare

    def _stops_before_state_cut(self, req: Request, num_drafts: int) -> bool:
        """Whether `req`'s last token and `num_drafts` drafts end before the next block boundary at which a
        chunk of a model with recurrent layers stops to snapshot its state (`KVCacheManager.chunk_end`; no
        boundary stops a chunk of other models). A step with drafts may not stop there (its drafts would go
        unchecked) and takes no snapshot (they may be rejected), so it ends a token short at least: the plain
        decode step that reaches the boundary takes the snapshot."""
        start = req.num_computed_tokens
        past = start + 1 + num_drafts + 1  # one token past the chunk: the chunk may end just before a boundary
        return self.kv_cache.chunk_end(start, past, req.branch_tokens) == past

    def _preempt(self, req: Request) -> None:
        # Recompute later: the completion so far becomes part of the next prefill,
        # which starts again from what the prefix cache still holds.
        # drafts in flight stay: reading the step back confirms the kept ones and forgets the rest, before the
        # request is admitted again (it waits for its placeholders)
        req.status = RequestStatus.WAITING
        self.kv_cache.deallocate(req)
        self._release_from_proposer(req)
        self.waiting.appendleft(req)
        self.num_preemptions += 1

    def _advance(self, reqs: list[Request], counts: list[int]) -> SchedulerOutput:
        """The step's lists; each request's chunk counts as computed, and one that samples gains a placeholder."""
        out = SchedulerOutput()
        with_penalties = any(req.params.has_penalties for req in reqs)
        if with_penalties:
            out.penalty_token_ids = []
        drafts = []
        if self.drafts_beside_steps:
            out.next_token_ids = []
        for req, n in zip(reqs, counts):
            out.req_ids.append(req.request_id)
            out.token_ids.append(req.chunk_token_ids(n))
            out.num_computed_tokens.append(req.num_computed_tokens)
            out.block_tables.append(req.block_tables)
            out.state_slots.append(req.state_slot)
            if req.params.prompt_logprobs is not None:
                self._score_prompt(req, n, len(out.req_ids) - 1, out)
            req.num_computed_tokens += n
            samples = req.num_computed_tokens == req.num_tokens
            out.samples.append(samples)
            if out.next_token_ids is not None:
                out.next_token_ids.append(PLACEHOLDER if samples else req.token_ids[req.num_computed_tokens])
            if samples:
                out.sampled_req_ids.append(req.request_id)
                out.sampling_params.append(req.params)
                # the completion before the first token drawn: drafts are among the tokens it draws
                out.num_output_tokens.append(req.num_output_tokens - len(req.draft_token_ids))
                if with_penalties:
                    out.penalty_token_ids.append(
                        (req.token_ids[: req.num_prompt_tokens], req.token_ids[req.num_prompt_tokens :])
                    )
                drafts.append(req.draft_token_ids)
                req.add_placeholder()
        if any(drafts):
            out.draft_token_ids = drafts
        out.state_restores, out.state_snapshots = self.kv_cache.take_state_copies()
        return out

    @staticmethod
    def _score_prompt(req: Request, n: int, index: int, out: SchedulerOutput) -> None:
        """Ask for the log-probabilities of the prompt tokens that follow this chunk's positions, those
        not scored before (a recompute after preemption scores nothing twice)."""
        start = req.num_computed_tokens
        first, end = max(start, req.num_prompt_scored), min(start + n, req.num_prompt_tokens - 1)
        if end > first:
            out.prompt_scoring.append(
                PromptScoring(
                    req.request_id, index, first - start, req.params.prompt_logprobs, req.token_ids[first + 1 : end + 1]
                )
            )
            req.num_prompt_scored = end

    def update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Confirm the tokens a finished step sampled; finish and free the requests that are done.

        A request that finished or was aborted after this step was scheduled is
        gone: its token is dropped.
        """
        outputs = []
        logprobs = result.logprobs
        prompt_logprobs = dict(result.prompt_logprobs)
        for i, (request_id, token_ids) in enumerate(zip(out.sampled_req_ids, result.sampled_token_ids)):
            req = self.requests.get(request_id)
            if req is None:
                continue
            drafts = out.draft_token_ids[i] if out.draft_token_ids is not None else []
            if drafts:
                self._count_drafts(req, len(drafts), len(token_ids) - 1)
            reason = None
            for n, token_id in enumerate(token_ids, 1):
                req.confirm(token_id)
                reason = self._grammar_finish_reason(req, token_id) or self.stop_checker.finish_reason(req)
                if reason is not None:
                    # a stop inside a run of kept drafts ends the request there
                    token_ids = token_ids[:n]
                    self._finish(req, reason)
                    break
            else:
                if drafts:
                    req.drop_rejected(len(drafts) + 1 - len(token_ids))
                if result.draft_token_ids is not None:
                    self.proposer.receive(request_id, req.num_tokens, result.draft_token_ids[i])
            stop_reason = token_id if reason == "stop" and token_id in req.params.stop_token_ids else None
            new_logprobs = None if logprobs is None or logprobs[i] is None else logprobs[i][: len(token_ids)]
            outputs.append(
                EngineCoreOutput(
                    request_id,
                    token_ids,
                    new_logprobs,
                    reason,
                    stop_reason,
                    req.num_cached_tokens,
                    prompt_logprobs.pop(request_id, None),
                )
            )
        # prompt chunks that scored positions without reaching the prompt's end
        outputs += [
            EngineCoreOutput(request_id, [], new_prompt_logprobs=scores)
            for request_id, scores in prompt_logprobs.items()
            if request_id in self.requests
        ]
        return outputs

    def _count_drafts(self, req: Request, num_drafts: int, num_accepted: int) -> None:
        """Acceptance counters, the request's and the engine's: `num_drafts` checked, `num_accepted` kept; a
        request none of whose drafts were kept pauses its proposals, twice as long (plus one) each time in a
        row, up to `_MOST_DRAFT_PAUSE` steps: under load a rejected draft costs as much compute as a token."""
        req.num_fruitless_drafts = 0 if num_accepted else req.num_fruitless_drafts + 1
        req.draft_pause = min(2**req.num_fruitless_drafts - 1, _MOST_DRAFT_PAUSE)
        req.num_drafts += 1
        req.num_draft_tokens += num_drafts
        req.num_accepted_tokens += num_accepted
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        per_position = self.num_accepted_per_position
        per_position += [0] * (num_drafts - len(per_position))  # grown for a proposer of a larger k than the first
        for position in range(num_accepted):
            per_position[position] += 1

    def _grammar_finish_reason(self, req: Request, token_id: int) -> str | None:
        """Advance a constrained request's grammar: "stop" once it is complete, "length" if it refused the
        token (only when no token it allows could be drawn, e.g. under a min_tokens ban), "error" if the
        matcher failed, else None."""
        if not self.structured.has(req.request_id):
            return None
        try:
            if not self.structured.accept(req.request_id, token_id):
                return "length"
            return "stop" if self.structured.is_terminated(req.request_id) else None
        except Exception:
            # a fault in one request's grammar ends that request only
            logger.exception("the grammar of request %s failed; it ends with an error", req.request_id)
            return "error"

    def _finish(self, req: Request, reason: str) -> None:
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
            self.kv_cache.deallocate(req)
        elif req.status == RequestStatus.WAITING:
            self.waiting.remove(req)
        self._release_from_proposer(req)
        if reason != "abort":
            self.output_estimate.observe(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        if req.num_drafts:
            logger.debug("request %s speculated: %s", req.request_id, req.speculation_summary())
        self.structured.remove(req.request_id)
        del self.requests[req.request_id]

    def _release_from_proposer(self, req: Request) -> None:
        # a proposer with state per request (a draft model's KV cache) frees it while the request waits
        if self.proposer is not None:
            self.proposer.release(req.request_id)

    def abort_all(self) -> list[str]:
        """Drop every live request; returns their ids."""
        request_ids = list(self.requests)
        self.abort(request_ids)
        return request_ids
