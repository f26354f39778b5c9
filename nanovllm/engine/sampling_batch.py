"""From a step's sampling rows to the sampler's per-row tensors."""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nanovllm.core.scheduler_output import SchedulerOutput
from nanovllm.layers.penalties import PenaltyTensors
from nanovllm.layers.sampler import SamplingTensors
from nanovllm.sampling_params import SamplingParams

ToDevice = Callable[[list, torch.dtype], torch.Tensor]
_SEED_RANGE = 1 << 63


def _banned_tokens(out: SchedulerOutput, eos_token_ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """(row, token) pairs that would stop a request still short of its min_tokens."""
    pairs = []
    for row, (params, num_output) in enumerate(zip(out.sampling_params, out.num_output_tokens)):
        if num_output < params.min_tokens:
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
            pairs += [(row, token_id) for token_id in sorted(stops)]
    return pairs


def _padded(rows: list[list[int]], pad: int) -> list[list[int]]:
    width = max(1, max(len(row) for row in rows))
    return [row + [pad] * (width - len(row)) for row in rows]


def _penalty_tensors(out: SchedulerOutput, vocab_size: int, to_device: ToDevice) -> PenaltyTensors:
    params = out.sampling_params
    return PenaltyTensors(
        repetition=to_device([p.repetition_penalty for p in params], torch.float32),
        frequency=to_device([p.frequency_penalty for p in params], torch.float32),
        presence=to_device([p.presence_penalty for p in params], torch.float32),
        prompt_ids=to_device(_padded([prompt for prompt, _ in out.penalty_token_ids], vocab_size), torch.int64),
        output_ids=to_device(_padded([output for _, output in out.penalty_token_ids], vocab_size), torch.int64),
    )


def _sample_positions(out: SchedulerOutput) -> list[int]:
    """Per sampling row: the position of the token it draws (its chunk's end)."""
    return [start + len(ids) for start, ids, samples in zip(out.num_computed_tokens, out.token_ids, out.samples)
            if samples]


@dataclass
class _Asked:
    """What a step's rows ask of the sampler beyond plain greedy, read once from their settings."""

    sampled: list[SamplingParams]       # the settings of the rows that draw (temperature > 0)
    banned: list[tuple[int, int]]       # (row, token) pairs min_tokens forbids
    biases: list[tuple[int, int, float]]  # (row, token, bias)
    logprobs: list[int]                 # the alternatives each row that wants logprobs asks for
    penalties: bool
    min_p: bool                         # min-p, top-k, top-p, seeds: among the drawing rows
    top_k: bool
    top_p: bool
    seeded: list[int]                   # drawing rows with a seed

    @property
    def beyond_temperature(self) -> bool:
        """Whether any row needs more than greedy or plain temperature sampling."""
        return bool(self.banned or self.biases or self.logprobs or self.penalties or self.min_p or self.top_k
                    or self.top_p or self.seeded)


def _asked(out: SchedulerOutput, eos_token_ids: tuple[int, ...]) -> _Asked:
    params = out.sampling_params
    sampled = [p for p in params if not p.is_greedy]
    return _Asked(
        sampled=sampled,
        banned=_banned_tokens(out, eos_token_ids),
        biases=[(row, token_id, bias) for row, p in enumerate(params) if p.logit_bias
                for token_id, bias in p.logit_bias.items()],
        logprobs=[p.logprobs for p in params if p.logprobs is not None],
        penalties=out.penalty_token_ids is not None,
        min_p=any(p.min_p > 0 for p in sampled),
        top_k=any(p.top_k > 0 for p in sampled),
        top_p=any(p.top_p < 1 for p in sampled),
        seeded=[row for row, p in enumerate(params) if p.seed is not None and not p.is_greedy],
    )


def samples_only_with_temperatures(out: SchedulerOutput, eos_token_ids: tuple[int, ...]) -> bool:
    """Whether every row is greedy or plain temperature sampling, which a decode step samples on the
    device by itself: exactly when `sampling_tensors` gives None or temperature-only tensors."""
    return not _asked(out, eos_token_ids).beyond_temperature


def sampling_tensors(out: SchedulerOutput, vocab_size: int, eos_token_ids: tuple[int, ...],
                     to_device: ToDevice) -> SamplingTensors | None:
    """The step's sampling settings as tensors; None when every row is plain greedy (the fast path)."""
    params = out.sampling_params
    asked = _asked(out, eos_token_ids)
    if not (asked.sampled or asked.beyond_temperature):
        return None
    tensors = SamplingTensors(
        penalties=_penalty_tensors(out, vocab_size, to_device) if asked.penalties else None,
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
        tensors.top_k = to_device([min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params],
                                  torch.int64)
    if asked.top_p:
        tensors.top_p = to_device([p.top_p for p in params], torch.float32)
    if asked.seeded:
        positions = _sample_positions(out)
        tensors.seeded_rows = to_device(asked.seeded, torch.int64)
        tensors.seeds = to_device([params[row].seed % _SEED_RANGE for row in asked.seeded], torch.int64)
        # the new token's position: the same at this point of the request whatever the batch
        tensors.positions = to_device([positions[row] for row in asked.seeded], torch.int64)
    return tensors
