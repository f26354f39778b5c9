"""Draft-model speculation: a smaller model with the target's vocabulary decodes each request's next tokens
greedily, on a model runner and a KV cache of its own."""

from dataclasses import dataclass, field, replace

from nanovllm.config import Config
from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sampling_params import SamplingParams
from nanovllm.spec_decode.proposer import Proposer
from nanovllm.worker.model_runner import ModelRunner

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass
class _DraftCache:
    """One request's part of the draft's KV cache: its block table of each of the draft's cache groups (every
    one holding a block per `block_size` tokens: the draft frees none behind a sliding window), and the
    tokens whose K/V they hold, the request's first `num_confirmed` tokens and then `drafted`, the drafts fed
    back at its last proposal (whose K/V stay right as far as the target kept them)."""

    block_tables: list[list[int]]
    num_confirmed: int = 0
    drafted: list[int] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        """Blocks the request holds in each group."""
        return len(self.block_tables[0])

    @property
    def blocks(self) -> list[int]:
        """Every block the request holds."""
        return [block for table in self.block_tables for block in table]

    def num_valid(self, token_ids: list[int]) -> int:
        """How many leading tokens of `token_ids`, the request's confirmed tokens now, the cache holds."""
        n = self.num_confirmed
        for draft, token in zip(self.drafted, token_ids[n:]):
            if draft != token:
                break
            n += 1
        return n


def _greedy_step(
    request_ids: list[str],
    token_ids: list[list[int]],
    starts: list[int],
    block_tables: list[list[list[int]]],
    samples: list[bool],
) -> SchedulerOutput:
    """A draft step: request i computes `token_ids[i]` from position `starts[i]` and, where `samples[i]`, takes
    the argmax after its last one."""
    sampled = [request_id for request_id, sample in zip(request_ids, samples) if sample]
    return SchedulerOutput(
        request_ids, token_ids, starts, block_tables, samples, sampled, [_GREEDY] * len(sampled), [0] * len(sampled)
    )


class DraftModelProposer(Proposer):
    """Proposes, for each request, the tokens the draft model decodes greedily after its confirmed tokens.

    The draft runs on a `ModelRunner` of its own (`Config.draft_config`) whose
    KV cache has as many blocks as the target's: the draft never holds more
    tokens of a request than the target does, so every running request fits
    where the draft has one cache group (with several, each holds a block per
    `block_size` tokens of the request). Each request keeps its blocks between
    steps (`_DraftCache`, by request id):
    a call computes the confirmed tokens the draft has not seen (a new
    request's whole prompt, in chunks of the token budget; after a step, the
    tokens the target emitted past the drafts it kept) and samples the first
    draft, then runs one greedy decode step per further draft. Drafts past
    the first the target rejects leave stale K/V behind them, which the next
    call overwrites, as it starts from the first token that differs. A
    request's blocks go back when the scheduler releases it (finished,
    aborted or preempted); should the cache run short all the same, a request
    that does not fit gets no drafts that step and its cache is dropped (to be
    computed afresh at a later step).

    Greedy drafts are point masses, so the target's sample-and-compare
    verification keeps its output distribution exact.
    """

    def __init__(self, config: Config, num_kvcache_blocks: int):
        assert config.draft_config is not None, "a draft model's Config is made where speculative_config is read"
        self.num_speculative_tokens = config.speculative.num_speculative_tokens
        self.runner = ModelRunner(replace(config.draft_config, num_kvcache_blocks=num_kvcache_blocks))
        self.token_budget = config.draft_config.token_budget
        self.free_blocks = list(range(self.runner.num_kvcache_blocks))
        self.num_groups = len(config.draft_config.kv_layout.groups)
        self.caches: dict[str, _DraftCache] = {}

    def propose(self, token_ids: list[list[int]], max_drafts: list[int], request_ids: list[str]) -> list[list[int]]:
        """Up to `max_drafts[i]` (at most `num_speculative_tokens`) greedy draft tokens per request."""
        counts = [min(k, self.num_speculative_tokens) for k in max_drafts]
        # the draft's cache holds a request's confirmed tokens and every draft but the last
        rows = [i for i, n in enumerate(counts) if n > 0 and self._reserve(request_ids[i], len(token_ids[i]) + n - 1)]
        drafts = [[] for _ in token_ids]
        first = self._catch_up([request_ids[i] for i in rows], [token_ids[i] for i in rows])
        for i, token_id in zip(rows, first):
            drafts[i].append(token_id)
        for step in range(1, max((counts[i] for i in rows), default=0)):
            going = [i for i in rows if counts[i] > step]
            sampled = self._run(
                _greedy_step(
                    [request_ids[i] for i in going],
                    [drafts[i][-1:] for i in going],
                    [len(token_ids[i]) + step - 1 for i in going],
                    [self.caches[request_ids[i]].block_tables for i in going],
                    [True] * len(going),
                )
            )
            for i, token_id in zip(going, sampled):
                drafts[i].append(token_id)
        for i in rows:
            cache = self.caches[request_ids[i]]
            cache.num_confirmed, cache.drafted = len(token_ids[i]), drafts[i][:-1]
        return drafts

    def _reserve(self, request_id: str, num_tokens: int) -> bool:
        """Give the request's cache blocks for `num_tokens` tokens in every cache group; False (and its cache
        freed) when too few blocks are free."""
        cache = self.caches.setdefault(request_id, _DraftCache([[] for _ in range(self.num_groups)]))
        bs = self.runner.block_size
        needed = (num_tokens + bs - 1) // bs - cache.num_blocks
        if needed * self.num_groups > len(self.free_blocks):
            self.release(request_id)
            return False
        for table in cache.block_tables:
            for _ in range(needed):
                table.append(self.free_blocks.pop())
        return True

    def _catch_up(self, request_ids: list[str], token_ids: list[list[int]]) -> list[int]:
        """Compute each request's confirmed tokens that its cache lacks (at least its last one, whose K/V
        the draft never computes otherwise), at most `token_budget` tokens a step; each request's first
        draft, the argmax after its last token."""
        starts = [min(self.caches[r].num_valid(ids), len(ids) - 1) for r, ids in zip(request_ids, token_ids)]
        first: dict[str, int] = {}
        pending = list(range(len(request_ids)))
        while pending:
            batch, chunks, left = [], [], self.token_budget
            for j in pending:
                if left == 0:
                    break
                n = min(len(token_ids[j]) - starts[j], left)
                batch.append(j)
                chunks.append(token_ids[j][starts[j] : starts[j] + n])
                left -= n
            step = _greedy_step(
                [request_ids[j] for j in batch],
                chunks,
                [starts[j] for j in batch],
                [self.caches[request_ids[j]].block_tables for j in batch],
                [starts[j] + len(chunk) == len(token_ids[j]) for j, chunk in zip(batch, chunks)],
            )
            first.update(zip(step.sampled_req_ids, self._run(step)))
            for j, chunk in zip(batch, chunks):
                starts[j] += len(chunk)
            pending = [j for j in pending if starts[j] < len(token_ids[j])]
        return [first[r] for r in request_ids]

    def _run(self, step: SchedulerOutput) -> list[int]:
        """The ids the step samples, one per sampling request (none when it only computes K/V)."""
        pending = self.runner.execute(step)
        return [] if pending is None else [ids[0] for ids in pending.result().sampled_token_ids]

    def release(self, request_id: str) -> None:
        """Give the request's draft blocks back."""
        cache = self.caches.pop(request_id, None)
        if cache is not None:
            self.free_blocks += cache.blocks

    def close(self) -> None:
        """Free the draft runner's decode graphs."""
        self.runner.close()
