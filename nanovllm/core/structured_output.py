"""Grammar-constrained decoding with xgrammar: a matcher per constrained request, a token bitmask per step.

A request's grammar comes from its StructuredOutputsParams (JSON schema, any
JSON object, regex, choice, EBNF), compiled once per distinct spec against the
model's vocabulary. Its matcher advances with each confirmed token; before a
step samples, the allowed tokens of every constrained row are written into one
bitmask (a bit per vocabulary id) that the sampler applies to the logits. A
matcher needs the previous step's token to give the next mask, so a step with
constrained rows launches its forward pass, then the engine core reads the
step before it back, advances the matchers and fills the masks while that
forward pass runs, and only then launches the sampling.
"""

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nanovllm.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:
    import torch


def _xgrammar():
    try:
        import xgrammar
    except ImportError:
        raise ValueError("structured outputs need the xgrammar package: pip install 'nanovllm[structured]'") from None
    return xgrammar


def _grammar_error(error: Exception) -> str:
    # xgrammar prefixes its messages with a time stamp and a source location
    return re.sub(r"^\[[^\]]*\] \S+:\d+: ", "", str(error)).strip()


def grammar_of(spec: StructuredOutputsParams):
    """The xgrammar Grammar of `spec`; ValueError that says what is wrong with an invalid schema,
    regex or grammar."""
    xgr = _xgrammar()
    try:
        # compact JSON: with free whitespace a sampled completion can wander off in blanks
        if spec.json is not None:
            return xgr.Grammar.from_json_schema(json.dumps(spec.json), any_whitespace=False)
        if spec.json_object:
            return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.regex is not None:
            return xgr.Grammar.from_regex(spec.regex)
        if spec.choice is not None:
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
        return xgr.Grammar.from_ebnf(spec.grammar)
    except RuntimeError as e:
        kind = next(name for name in ("json", "regex", "choice", "grammar") if getattr(spec, name) is not None)
        raise ValueError(f"the structured_outputs {kind} is invalid: {_grammar_error(e)}") from None


def grammar_vocabulary(tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
    """The vocabulary description grammars are compiled against (xgrammar's TokenizerInfo), or None
    where xgrammar is not installed; stop tokens end a completed grammar."""
    try:
        import xgrammar
    except ImportError:
        return None
    # without stop ids of its own the library takes the tokenizer's
    return xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None
    )


@dataclass
class GrammarBitmasks:
    """The constrained rows among a step's `num_rows` sampling rows, and their matchers; `fill()` writes
    their allowed tokens (run while the device computes the step's forward pass), the rows on several
    threads (`filler`, an xgrammar BatchGrammarMatcher)."""

    num_rows: int
    rows: list[int]
    matchers: list
    vocab_size: int
    filler: object

    def fill(self, out: "torch.Tensor | None" = None) -> "torch.Tensor":
        """[num_rows, ceil(vocab / 32)] int32, a row per sampling row: bit j of word w allows token
        32 w + j. Written into `out` when given (the rows of unconstrained requests are then left as they
        were: only `rows` are applied), else into a new tensor whose other rows allow everything."""
        bitmask = _xgrammar().allocate_token_bitmask(self.num_rows, self.vocab_size) if out is None else out
        self.filler.batch_fill_next_token_bitmask(self.matchers, bitmask, indices=self.rows)
        return bitmask


class StructuredOutputs:
    """The grammar matchers of the live constrained requests."""

    def __init__(self, vocabulary):
        self.vocabulary = vocabulary
        self._compiler = None
        self._filler = None  # fills many rows' masks on several threads
        self._matchers: dict[str, object] = {}

    def add(self, request_id: str, spec: StructuredOutputsParams) -> None:
        """Compile (or reuse) the spec's grammar and start a matcher for the request."""
        if self.vocabulary is None:
            raise ValueError("structured outputs need the xgrammar package and a tokenizer")
        xgr = _xgrammar()
        if self._compiler is None:
            self._compiler = xgr.GrammarCompiler(self.vocabulary)
            self._filler = xgr.BatchGrammarMatcher()
        self._matchers[request_id] = xgr.GrammarMatcher(self._compiler.compile_grammar(grammar_of(spec)))

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def has(self, request_id: str) -> bool:
        return request_id in self._matchers

    def accept(self, request_id: str, token_id: int) -> bool:
        """Advance the request's matcher by a sampled token; False if the grammar refuses it."""
        return self._matchers[request_id].accept_token(token_id)

    def is_terminated(self, request_id: str) -> bool:
        """Whether the grammar is complete and its stop token accepted."""
        return self._matchers[request_id].is_terminated()

    def constrains(self, sampled_req_ids: list[str]) -> bool:
        """Whether a grammar holds some of a step's sampling rows."""
        return bool(self._matchers) and any(request_id in self._matchers for request_id in sampled_req_ids)

    def bitmasks(self, sampled_req_ids: list[str]) -> GrammarBitmasks | None:
        """The masks of a step whose sampling rows are `sampled_req_ids`; None if none is constrained."""
        if not self._matchers:
            return None
        rows = [row for row, request_id in enumerate(sampled_req_ids) if request_id in self._matchers]
        if not rows:
            return None
        return GrammarBitmasks(
            len(sampled_req_ids),
            rows,
            [self._matchers[sampled_req_ids[row]] for row in rows],
            self.vocabulary.vocab_size,
            self._filler,
        )


def vocabulary_to_json(vocabulary) -> str | None:
    """The vocabulary description as text, to hand it to the engine core in another process."""
    return None if vocabulary is None else vocabulary.serialize_json()


def vocabulary_from_json(text: str | None):
    """The vocabulary description `vocabulary_to_json` wrote (None stays None)."""
    return None if text is None else _xgrammar().TokenizerInfo.deserialize_json(text)
