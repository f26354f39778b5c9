"""What the scheduler hands the model runner for one step: plain lists, in batch order."""

from dataclasses import dataclass, field

from nanovllm.sampling_params import SamplingParams

# A token that the previous step sampled and that is still on the device only:
# the runner takes it from that step's sampled ids without a trip through the host.
PLACEHOLDER = -1


@dataclass
class PromptScoring:
    """Prompt positions of one scheduled request whose next-token log-probabilities are asked for: the
    chunk's positions `offset` onwards, one per entry of `target_ids` (the prompt token that follows
    each), with the top `num_logprobs` alternatives."""

    request_id: str
    index: int  # the request's place in the batch
    offset: int
    num_logprobs: int
    target_ids: list[int]


@dataclass
class SchedulerOutput:
    """One step: which requests run, which of their tokens, and which of them sample.

    Per scheduled request, in batch order: `token_ids` are the tokens whose
    K/V this step computes (a decode's single token, or a prompt chunk), starting
    at position `num_computed_tokens`; `block_tables` hold its KV blocks, one
    table per cache group (`CacheLayout.groups`), where a sliding group's table
    has -1 for the blocks behind every window the step may read;
    `samples` says whether the chunk reaches the request's last token, so that
    the step samples its next one. The per-sampler fields list only the requests
    that sample, in batch order: their settings and how many completion tokens
    came before the one drawn now (placeholders included; with drafts, before
    the first one drawn). `penalty_token_ids` holds each sampling request's
    (prompt, completion) ids when some of them have penalties; such steps are
    scheduled only once every token is confirmed. `draft_token_ids` holds each
    sampling request's drafts, the last tokens of its chunk, when some request
    speculates (None when none does): such a request draws a token for each
    draft's position and one after the last, and keeps its drafts while each
    equals the token drawn for its position.
    `prompt_scoring` lists the prompt positions to score for prompt logprobs.
    With speculative method "mtp", `next_token_ids` holds per request the token
    after its chunk where the chunk does not sample (the next prompt token),
    else PLACEHOLDER: the multi-token-prediction layer reads the token after
    each position (`worker/mtp_drafter.py`); elsewhere it is None.
    On a model with recurrent layers, `state_slots` holds each request's state
    slot (-1 elsewhere), `state_restores` the (source slot, or -1 for zeros;
    live slot) copies to make before the forward pass, and `state_snapshots`
    the (live slot, snapshot slot) copies to make after it
    (`core/state_slots.py`).

    The lists are built for this step and read during `execute` only.
    """

    req_ids: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    block_tables: list[list[list[int]]] = field(default_factory=list)  # [requests][cache groups][blocks]
    samples: list[bool] = field(default_factory=list)
    sampled_req_ids: list[str] = field(default_factory=list)
    sampling_params: list[SamplingParams] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)
    penalty_token_ids: list[tuple[list[int], list[int]]] | None = None
    draft_token_ids: list[list[int]] | None = None
    prompt_scoring: list[PromptScoring] = field(default_factory=list)
    next_token_ids: list[int] | None = None
    state_slots: list[int] = field(default_factory=list)
    state_restores: list[tuple[int, int]] = field(default_factory=list)
    state_snapshots: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> list[int]:
        return [len(ids) for ids in self.token_ids]

    @property
    def is_empty(self) -> bool:
        return not self.req_ids

    @property
    def is_decode(self) -> bool:
        """Every request samples and computes exactly its last token, and its drafts where it has some (a
        verify step): the path CUDA graphs replay."""
        if len(self.sampled_req_ids) != len(self.req_ids):
            return False
        drafts = self.draft_token_ids or [()] * len(self.req_ids)
        return all(len(ids) == 1 + len(d) for ids, d in zip(self.token_ids, drafts))

    def without_sampling(self) -> "SchedulerOutput":
        """The same step less what only the sampling rank reads (settings and penalty tokens); the drafts
        stay, as every rank scores their positions."""
        return SchedulerOutput(
            self.req_ids,
            self.token_ids,
            self.num_computed_tokens,
            self.block_tables,
            self.samples,
            self.sampled_req_ids,
            draft_token_ids=self.draft_token_ids,
            prompt_scoring=self.prompt_scoring,
            next_token_ids=self.next_token_ids,
            state_slots=self.state_slots,
            state_restores=self.state_restores,
            state_snapshots=self.state_snapshots,
        )
