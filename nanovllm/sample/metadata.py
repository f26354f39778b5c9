"""Sampling metadata: a step's sampling rows as the sampler's per-row tensors, and the one predicate
that tells a step that needs the full sampler from one that is greedy or plain temperature sampling."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.sample.noise import request_noise_key
from nanovllm.sample.penalties import PenaltyTensors
from nanovllm.sampling_params import SamplingParams

ToDevice = Callable[[list, torch.dtype], torch.Tensor]


def needs_full_sampler(
    *,
    min_p: bool,
    top_k: bool,
    top_p: bool,
    seeded: bool,
    penalties: bool,
    logit_bias: bool,
    banned: bool,
    grammar: bool,
) -> bool:
    """The fast-path predicate, the only one: whether some row of a step needs more than greedy or plain
    temperature sampling, which `sample_with_temperatures` does alone (inside a decode step's CUDA graph
    too). The host side (`StepSampling`, before the forward: may the decode step's own sampling stand?)
    and the device side (`SamplingTensors.temperature_only`: the Sampler's branch) both ask it; every
    feature is a required keyword, so a new feature must be named by both. Logprobs are not among them:
    they are read from the raw logits after any draw."""
    return min_p or top_k or top_p or seeded or penalties or logit_bias or banned or grammar


@dataclass
class SamplingTensors:
    """Per-row settings for one batch of logits; a None field is a feature no row uses."""

    temperatures: torch.Tensor | None = None  # [num_seqs] float32; 0 = greedy; None = all greedy
    min_p: torch.Tensor | None = None  # [num_seqs] float32; 0 = off
    top_k: torch.Tensor | None = None  # [num_seqs] int64; vocab size = off
    top_p: torch.Tensor | None = None  # [num_seqs] float32; 1 = off
    seeded_rows: torch.Tensor | None = None  # [num_seeded] int64: rows whose noise comes from a seed
    seeds: torch.Tensor | None = None  # [num_seeded] int64: their noise keys (`request_noise_key`)
    positions: torch.Tensor | None = None  # [num_seeded] int64: position of the token being drawn
    penalties: PenaltyTensors | None = None
    bias_index: torch.Tensor | None = None  # [2, n] int64: (row, token id) pairs that get a logit bias
    bias_values: torch.Tensor | None = None  # [n] float32: their biases
    banned: torch.Tensor | None = None  # [2, n] int64: (row, token id) pairs that may not be drawn
    bitmask: torch.Tensor | None = None  # [num_seqs, ceil(vocab / 32)] int32: allowed tokens per row
    bitmask_rows: torch.Tensor | None = None  # [n] int32: the rows the bitmask constrains
    num_logprobs: int | None = None  # most alternatives any row asks for; None = no logprobs

    @property
    def truncates(self) -> bool:
        """Some row asks for min-p, top-k or top-p."""
        return self.min_p is not None or self.top_k is not None or self.top_p is not None

    @property
    def drawn_by_threshold(self) -> bool:
        """No row asks for a seed, a penalty or a logit bias, and grammar masks and banned tokens come without
        logprobs (which read the raw logits): masks and bans can then be applied to the logits in place, and
        the Gumbel-max kernel draws each row among its logits at or above its truncation threshold."""
        masked = self.bitmask is not None or self.banned is not None
        return not (
            self.seeded_rows is not None
            or self.penalties is not None
            or self.bias_index is not None
            or (masked and self.num_logprobs is not None)
        )

    @property
    def temperature_only(self) -> bool:
        """No row needs the full sampler (`needs_full_sampler`): every row is greedy or plain temperature
        sampling, with or without logprobs."""
        return not needs_full_sampler(
            min_p=self.min_p is not None,
            top_k=self.top_k is not None,
            top_p=self.top_p is not None,
            seeded=self.seeded_rows is not None,
            penalties=self.penalties is not None,
            logit_bias=self.bias_index is not None,
            banned=self.banned is not None,
            grammar=self.bitmask is not None,
        )


@dataclass
class SamplingRows:
    """A step's rows of logits to sample, each with its request's settings: one per sampling request, or
    for a request with drafts one per draft's position and one after the last draft."""

    params: list[SamplingParams]
    num_output_tokens: list[int]  # completion tokens before the one the row draws
    positions: list[int]  # the position of the token the row draws
    penalty_token_ids: list[tuple[list[int], list[int]]] | None  # the row's request's (prompt, completion)


def sampling_rows(out: SchedulerOutput, rows_per_request: int | None = None) -> SamplingRows:
    """The step's sampling rows (the requests' own lists when nothing drafts). With drafts and
    `rows_per_request` (a verify step padded to fixed shapes), each request has that many rows, those after
    its last draft's as if it had more drafts; their draws are never kept."""
    positions = _sample_positions(out)
    if out.draft_token_ids is None:
        return SamplingRows(out.sampling_params, out.num_output_tokens, positions, out.penalty_token_ids)
    rows = SamplingRows([], [], [], None if out.penalty_token_ids is None else [])
    for i, (params, num_output, end, drafts) in enumerate(
        zip(out.sampling_params, out.num_output_tokens, positions, out.draft_token_ids)
    ):
        n = rows_per_request or len(drafts) + 1
        rows.params += [params] * n
        rows.num_output_tokens += range(num_output, num_output + n)
        rows.positions += range(end - len(drafts), end - len(drafts) + n)
        if rows.penalty_token_ids is not None:
            rows.penalty_token_ids += [out.penalty_token_ids[i]] * n
    return rows


def _banned_tokens(rows: SamplingRows, eos_token_ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """(row, token) pairs that would stop a request still short of its min_tokens."""
    pairs = []
    for row, (params, num_output) in enumerate(zip(rows.params, rows.num_output_tokens)):
        if num_output < params.min_tokens:
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
            pairs += [(row, token_id) for token_id in sorted(stops)]
    return pairs


def _padded(rows: list[list[int]], pad: int) -> list[list[int]]:
    width = max(1, max(len(row) for row in rows))
    return [row + [pad] * (width - len(row)) for row in rows]


def _penalty_tensors(rows: SamplingRows, vocab_size: int, to_device: ToDevice) -> PenaltyTensors:
    params = rows.params
    return PenaltyTensors(
        repetition=to_device([p.repetition_penalty for p in params], torch.float32),
        frequency=to_device([p.frequency_penalty for p in params], torch.float32),
        presence=to_device([p.presence_penalty for p in params], torch.float32),
        prompt_ids=to_device(_padded([prompt for prompt, _ in rows.penalty_token_ids], vocab_size), torch.int64),
        output_ids=to_device(_padded([output for _, output in rows.penalty_token_ids], vocab_size), torch.int64),
    )


def _sample_positions(out: SchedulerOutput) -> list[int]:
    """Per sampling request: the position of the token it draws after its chunk."""
    return [
        start + len(ids) for start, ids, samples in zip(out.num_computed_tokens, out.token_ids, out.samples) if samples
    ]


@dataclass
class StepSampling:
    """What a step's rows ask of the sampler beyond plain greedy, read once from their settings."""

    sampled: list[SamplingParams]  # the settings of the rows that draw (temperature > 0)
    banned: list[tuple[int, int]]  # (row, token) pairs min_tokens forbids
    biases: list[tuple[int, int, float]]  # (row, token, bias)
    logprobs: list[int]  # the alternatives each row that wants logprobs asks for
    penalties: bool
    min_p: bool  # min-p, top-k, top-p, seeds: among the drawing rows
    top_k: bool
    top_p: bool
    seeded: list[int]  # drawing rows with a seed
    grammar: bool  # some row is constrained by a grammar

    @property
    def needs_full_sampler(self) -> bool:
        """Whether some row needs more than greedy or plain temperature sampling (`needs_full_sampler`)."""
        return needs_full_sampler(
            min_p=self.min_p,
            top_k=self.top_k,
            top_p=self.top_p,
            seeded=bool(self.seeded),
            penalties=self.penalties,
            logit_bias=bool(self.biases),
            banned=bool(self.banned),
            grammar=self.grammar,
        )


def step_sampling(
    out: SchedulerOutput, eos_token_ids: tuple[int, ...], grammar: bool = False, rows_per_request: int | None = None
) -> StepSampling:
    """What the step's rows ask of the sampler (`sampling_rows`); `grammar`: whether some row is constrained."""
    return _asked(sampling_rows(out, rows_per_request), eos_token_ids, grammar)


def _asked(rows: SamplingRows, eos_token_ids: tuple[int, ...], grammar: bool = False) -> StepSampling:
    """What the sampling rows ask of the sampler (`step_sampling`, once the rows are known)."""
    params = rows.params
    sampled = [p for p in params if not p.is_greedy]
    return StepSampling(
        sampled=sampled,
        banned=_banned_tokens(rows, eos_token_ids),
        biases=[
            (row, token_id, bias)
            for row, p in enumerate(params)
            if p.logit_bias
            for token_id, bias in p.logit_bias.items()
        ],
        logprobs=[p.logprobs for p in params if p.logprobs is not None],
        penalties=rows.penalty_token_ids is not None,
        min_p=any(p.min_p > 0 for p in sampled),
        top_k=any(p.top_k > 0 for p in sampled),
        top_p=any(p.top_p < 1 for p in sampled),
        seeded=[row for row, p in enumerate(params) if p.seed is not None and not p.is_greedy],
        grammar=grammar,
    )


def sampling_tensors(
    out: SchedulerOutput,
    vocab_size: int,
    eos_token_ids: tuple[int, ...],
    to_device: ToDevice,
    rows_per_request: int | None = None,
) -> SamplingTensors | None:
    """The step's sampling settings as tensors, a row per sampling row (`sampling_rows`); None when every
    row is plain greedy without logprobs. Grammar masks are not among them: the runner adds them once
    they are filled."""
    rows = sampling_rows(out, rows_per_request)
    params = rows.params
    asked = _asked(rows, eos_token_ids)
    if not (asked.sampled or asked.needs_full_sampler or asked.logprobs):
        return None
    tensors = SamplingTensors(
        penalties=_penalty_tensors(rows, vocab_size, to_device) if asked.penalties else None,
        banned=to_device(asked.banned, torch.int64).T if asked.banned else None,
        num_logprobs=max(asked.logprobs) if asked.logprobs else None,
    )
    if asked.biases:
        tensors.bias_index = to_device([(row, token_id) for row, token_id, _ in asked.biases], torch.int64).T
        tensors.bias_values = to_device([bias for _, _, bias in asked.biases], torch.float32)
    if not asked.sampled:
        return tensors
    tensors.temperatures = to_device([p.temperature for p in params], torch.float32)
    if asked.min_p:
        tensors.min_p = to_device([p.min_p for p in params], torch.float32)
    if asked.top_k:
        tensors.top_k = to_device(
            [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params], torch.int64
        )
    if asked.top_p:
        tensors.top_p = to_device([p.top_p for p in params], torch.float32)
    if asked.seeded:
        positions = rows.positions
        tensors.seeded_rows = to_device(asked.seeded, torch.int64)
        tensors.seeds = to_device([request_noise_key(params[row].seed) for row in asked.seeded], torch.int64)
        # the new token's position: the same at this point of the request whatever the batch
        tensors.positions = to_device([positions[row] for row in asked.seeded], torch.int64)
    return tensors


@dataclass
class DecodeDraw:
    """How a decode step's rows are drawn, decided where the sampling settings are (rank 0) and sent with
    the step to every other rank, which draws too: each request's temperature, whether the decode step's
    own draw stands (no row needs the full sampler) and the most logprob alternatives a row asks for."""

    temperatures: list[float]  # per request; 0 = greedy
    in_step: bool
    num_logprobs: int | None = None  # None: no row asks for logprobs

    @property
    def needs_logits(self) -> bool:
        """Whether the sampling rank reads the step's logits after the draw: to sample again, or for logprobs."""
        return not self.in_step or self.num_logprobs is not None


def decode_draw(
    out: SchedulerOutput, eos_token_ids: tuple[int, ...], grammar: bool = False, rows_per_request: int | None = None
) -> DecodeDraw:
    """How the decode step `out` draws (`step_sampling`'s arguments)."""
    asked = step_sampling(out, eos_token_ids, grammar, rows_per_request)
    return DecodeDraw(
        [p.temperature for p in out.sampling_params],
        not asked.needs_full_sampler,
        max(asked.logprobs) if asked.logprobs else None,
    )
