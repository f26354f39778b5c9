"""Between sequences and the sampler: per-row tensors in, per-sequence token ids and logprobs out."""

from collections.abc import Callable

import torch

from nanovllm.engine.sequence import Sequence
from nanovllm.layers.penalties import PenaltyTensors
from nanovllm.layers.sampler import SamplerOutput, SamplingTensors

ToDevice = Callable[[list, torch.dtype], torch.Tensor]
_SEED_RANGE = 1 << 63


def _banned_tokens(seqs: list[Sequence], eos_token_ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """(row, token) pairs that would stop a sequence still short of its min_tokens."""
    pairs = []
    for row, seq in enumerate(seqs):
        params = seq.params
        if seq.num_completion_tokens < params.min_tokens:
            stops = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
            pairs += [(row, token_id) for token_id in sorted(stops)]
    return pairs


def _padded(rows: list[list[int]], pad: int) -> list[list[int]]:
    width = max(1, max(len(row) for row in rows))
    return [row + [pad] * (width - len(row)) for row in rows]


def _penalty_tensors(seqs: list[Sequence], vocab_size: int, to_device: ToDevice) -> PenaltyTensors:
    params = [seq.params for seq in seqs]
    return PenaltyTensors(
        repetition=to_device([p.repetition_penalty for p in params], torch.float32),
        frequency=to_device([p.frequency_penalty for p in params], torch.float32),
        presence=to_device([p.presence_penalty for p in params], torch.float32),
        prompt_ids=to_device(_padded([seq.prompt_token_ids for seq in seqs], vocab_size), torch.int64),
        output_ids=to_device(_padded([seq.completion_token_ids for seq in seqs], vocab_size), torch.int64),
    )


def sampling_tensors(seqs: list[Sequence], vocab_size: int, eos_token_ids: tuple[int, ...],
                     to_device: ToDevice) -> SamplingTensors | None:
    """The batch's settings as tensors; None when every row is plain greedy (the fast path)."""
    params = [seq.params for seq in seqs]
    banned = _banned_tokens(seqs, eos_token_ids)
    sampled = [p for p in params if not p.is_greedy]
    wants_logprobs = [p.logprobs for p in params if p.logprobs is not None]
    has_penalties = any(p.has_penalties for p in params)
    if not (sampled or banned or wants_logprobs or has_penalties):
        return None
    tensors = SamplingTensors(
        penalties=_penalty_tensors(seqs, vocab_size, to_device) if has_penalties else None,
        banned=to_device(banned, torch.int64).T if banned else None,
        num_logprobs=max(wants_logprobs) if wants_logprobs else None,
    )
    if not sampled:
        return tensors
    tensors.temperatures = to_device([p.temperature for p in params], torch.float32)
    if any(p.min_p > 0 for p in sampled):
        tensors.min_p = to_device([p.min_p for p in params], torch.float32)
    if any(p.top_k > 0 for p in sampled):
        tensors.top_k = to_device([min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in params],
                                  torch.int64)
    if any(p.top_p < 1 for p in sampled):
        tensors.top_p = to_device([p.top_p for p in params], torch.float32)
    seeded = [(row, seq) for row, seq in enumerate(seqs)
              if seq.params.seed is not None and not seq.params.is_greedy]
    if seeded:
        tensors.seeded_rows = to_device([row for row, _ in seeded], torch.int64)
        tensors.seeds = to_device([seq.params.seed % _SEED_RANGE for _, seq in seeded], torch.int64)
        # the new token's position: the same at this point of the request whatever the batch
        tensors.positions = to_device([seq.num_tokens for _, seq in seeded], torch.int64)
    return tensors


def logprob_dicts(seqs: list[Sequence], output: SamplerOutput) -> list[dict[int, float] | None] | None:
    """Per sequence that asked: {token id: logprob} for the chosen token and its top alternatives."""
    if output.logprobs is None:
        return None
    ids, values = output.logprob_token_ids.tolist(), output.logprobs.tolist()
    return [None if seq.params.logprobs is None
            else dict(zip(row_ids[: 1 + seq.params.logprobs], row_values[: 1 + seq.params.logprobs]))
            for seq, row_ids, row_values in zip(seqs, ids, values)]
