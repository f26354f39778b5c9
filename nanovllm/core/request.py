"""One request inside the engine core: its token ids, its place in the KV cache and its progress."""

from enum import Enum, auto

from nanovllm.core.scheduler_output import PLACEHOLDER
from nanovllm.sampling_params import SamplingParams


class RequestStatus(Enum):
    """Where a request is in its life."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Request:
    """A prompt and its completion as token ids, with the blocks that hold their K/V.

    Progress is counts, not phases. `num_tokens` counts every token the request
    has: `token_ids` (the confirmed ones, prompt then completion) plus
    `num_placeholders`, tokens that a launched step samples but whose values the
    host has not read back yet (at most the one of the step in flight, and for a
    moment also the one of the step just scheduled; with drafts in flight those
    count as if all will be kept). A speculating request's
    placeholders include `draft_token_ids`, the newest step's guesses of their
    values from position `first_draft_position` on (right after the last confirmed
    token, or after the token still in flight), that the step computes K/V for
    and checks (an earlier step's drafts may still be in flight too); the kept
    ones are confirmed, the others forgotten (`drop_rejected`). `num_computed_tokens`
    counts the tokens whose K/V is in the cache or being written by a launched
    step; a step computes positions `num_computed_tokens` onwards, or a first
    chunk of them, and samples when it reaches `num_tokens`.
    `block_tables` holds its KV blocks, one table per cache group (empty while
    it waits), and `block_hashes` the chained hashes of its leading full blocks
    of confirmed tokens, computed once each for the prefix cache. On a model
    with recurrent layers it holds, while it runs, the state slot its state
    lives in and one holding its state as of its first `snapshot_tokens` tokens
    (`core/state_slots.py`); -1 otherwise. `branch_tokens` is where the cache held
    its KV blocks past that snapshot at its last admission (0: nowhere), a
    prefix that others share: its state there is cached too.
    `num_cached_tokens` is how many prompt tokens the prefix cache supplied at
    the last admission. `num_prompt_scored` counts the prompt positions whose
    next-token log-probabilities were computed (for prompt logprobs).
    `num_drafts`, `num_draft_tokens` and `num_accepted_tokens` count its steps
    that checked drafts, the drafts checked and those kept, over its life;
    `num_fruitless_drafts` its latest steps in a row whose drafts were all
    rejected, and `draft_pause` the steps it still proposes nothing for after them.
    """

    __slots__ = (
        "request_id",
        "params",
        "block_size",
        "status",
        "token_ids",
        "num_prompt_tokens",
        "num_tokens",
        "num_placeholders",
        "num_computed_tokens",
        "num_cached_tokens",
        "num_prompt_scored",
        "draft_token_ids",
        "first_draft_position",
        "num_drafts",
        "num_draft_tokens",
        "num_accepted_tokens",
        "num_fruitless_drafts",
        "draft_pause",
        "block_tables",
        "block_hashes",
        "state_slot",
        "snapshot_slot",
        "snapshot_tokens",
        "branch_tokens",
        "finish_reason",
    )

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, block_size: int):
        self.request_id = request_id
        self.params = params
        self.block_size = block_size
        self.status = RequestStatus.WAITING
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_tokens = len(prompt_token_ids)
        self.num_placeholders = 0
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.num_prompt_scored = 0
        self.draft_token_ids: list[int] = []
        self.first_draft_position = 0
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.num_fruitless_drafts = self.draft_pause = 0
        self.block_tables: list[list[int]] = []
        self.block_hashes: list[int] = []
        self.state_slot = self.snapshot_slot = -1
        self.snapshot_tokens = 0
        self.branch_tokens = 0
        self.finish_reason: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def num_output_tokens(self) -> int:
        """Completion tokens, placeholders included."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_new_tokens(self) -> int:
        """Tokens whose K/V is not computed yet."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_blocks(self) -> int:
        """Blocks that hold every token, placeholders included."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        """Confirmed token ids of logical block `i`."""
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def chunk_token_ids(self, n: int) -> list[int]:
        """The next `n` tokens to compute: confirmed ones, then drafts; a position whose token is still on the
        device (before the drafts or after them) is PLACEHOLDER."""
        start, end = self.num_computed_tokens, self.num_computed_tokens + n
        ids = self.token_ids[start:end]
        if len(ids) < n and self.draft_token_ids:
            first = self.first_draft_position
            ids += [PLACEHOLDER] * (min(first, end) - start - len(ids))
            ids += self.draft_token_ids[max(0, start - first) : end - first]
        return ids + [PLACEHOLDER] * (n - len(ids))

    def speculation_summary(self) -> str:
        """The share of drafts kept and the mean tokens a step with drafts emitted (kept drafts plus the token
        after them), as a line for the log."""
        rate = self.num_accepted_tokens / self.num_draft_tokens
        length = (self.num_accepted_tokens + self.num_drafts) / self.num_drafts
        kept = f"{self.num_accepted_tokens} of {self.num_draft_tokens} drafts kept"
        return f"{kept} ({rate:.0%}), {length:.2f} tokens a step"

    def add_drafts(self, token_ids: list[int]) -> None:
        """Guesses of the tokens after the last one (confirmed, or still in flight), which the next step
        computes and checks."""
        assert not self.draft_token_ids, "a request's drafts are checked before it gets new ones"
        self.draft_token_ids = token_ids
        self.first_draft_position = self.num_tokens
        self.num_placeholders += len(token_ids)
        self.num_tokens += len(token_ids)

    def drop_rejected(self, num_rejected: int) -> None:
        """After a speculative step's kept tokens are confirmed: forget its `num_rejected` rejected drafts. Their
        K/V counts as not computed, so that the next step overwrites it; a later step already launched computed
        its tokens as if every draft had been kept, so they (and its drafts) move back by as many positions, as
        the device moved them."""
        self.num_tokens -= num_rejected
        self.num_placeholders -= num_rejected
        self.num_computed_tokens = max(0, self.num_computed_tokens - num_rejected)
        self.first_draft_position -= num_rejected
        if not self.num_placeholders:
            self.draft_token_ids = []

    def pass_drafts_in_flight(self) -> None:
        """Schedule the next step as if every draft in flight will be kept: those drafts stay with their step
        for the check (`drop_rejected` then moves what follows back), and the next step may draft anew."""
        self.draft_token_ids = []

    def add_placeholder(self) -> None:
        """A launched step samples this request's next token."""
        self.num_placeholders += 1
        self.num_tokens += 1

    def confirm(self, token_id: int) -> None:
        """The oldest placeholder's value, read back from its step."""
        self.token_ids.append(token_id)
        self.num_placeholders -= 1
