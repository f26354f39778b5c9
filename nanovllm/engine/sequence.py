"""One request: its tokens, its place in the KV cache and its progress."""

from copy import copy
from enum import Enum, auto
from itertools import count

from nanovllm.engine.detokenizer import IncrementalDetokenizer
from nanovllm.sampling_params import SamplingParams


class SequenceStatus(Enum):
    """Where a sequence is in its life."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """A prompt and its completion, with the blocks that hold their K/V.

    Progress is two counts: `num_tokens` (prompt + completion so far) and
    `num_computed_tokens` (how many of them already have K/V in the cache). A
    step computes `token_ids[num_computed_tokens:]`, or only its first chunk
    when a long prompt is split over several steps; the sequence samples its
    next token on the step that reaches `num_tokens`.
    `num_cached_tokens` records how many prompt tokens the prefix cache supplied
    at the last allocation.

    The output so far lives here too, for the caller to read after each step:
    `output_text` (grown by the detokenizer, when the sequence has one),
    `finish_reason` ("stop" or "length" once finished, else None) and, when
    asked for, `logprobs` (one {token id: log-probability} dict per
    completion token).
    """

    _ids = count()

    def __init__(self, token_ids: list[int], sampling_params: SamplingParams, block_size: int,
                 detokenizer: IncrementalDetokenizer | None = None):
        self.seq_id = next(Sequence._ids)
        self.block_size = block_size
        self.status = SequenceStatus.WAITING
        self.token_ids = copy(token_ids)
        self.last_token = token_ids[-1]
        self.num_tokens = len(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_table: list[int] = []
        self.params = sampling_params
        self.detokenizer = detokenizer
        self.output_text = ""
        self.finish_reason: str | None = None
        self.logprobs: list[dict[int, float]] = []

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def stream_text(self) -> str:
        """The text that can be sent so far: all of it once finished; before that,
        less the tail that may still turn out to be the start of a stop string."""
        if self.is_finished or not self.params.stop:
            return self.output_text
        held = max(len(s) for s in self.params.stop) - 1
        return self.output_text[: max(len(self.output_text) - held, 0)]

    @property
    def num_completion_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_blocks(self) -> int:
        """Blocks needed to hold every token of the sequence."""
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def num_new_tokens(self) -> int:
        """Tokens whose K/V the next step computes."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def new_token_ids(self) -> list[int]:
        """The tokens themselves; on a worker that got the compact state, too."""
        return self.chunk_token_ids(self.num_new_tokens)

    def chunk_token_ids(self, n: int) -> list[int]:
        """The next `n` tokens to compute (a prompt chunk when fewer than `num_new_tokens`)."""
        if self.num_new_tokens == 1:
            return [self.last_token]
        return self.token_ids[self.num_computed_tokens : self.num_computed_tokens + n]

    def block(self, i: int) -> list[int]:
        """Token ids of logical block `i`."""
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.last_token = token_id
        self.num_tokens += 1

    def __getstate__(self):
        # Workers need only the tokens they will compute: the whole list before
        # the first completion token and for a recompute after preemption, then
        # just the last token.
        is_decode = self.num_completion_tokens > 0 and self.num_new_tokens == 1
        tokens = self.last_token if is_decode else self.token_ids
        return (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens,
                self.block_table, tokens)

    def __setstate__(self, state) -> None:
        (self.seq_id, self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens,
         self.block_table, tokens) = state
        if isinstance(tokens, list):
            self.token_ids = tokens
            self.last_token = tokens[-1]
        else:
            self.token_ids = []
            self.last_token = tokens
