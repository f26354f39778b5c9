"""Token sampling in one batched pass: penalties, temperature, truncation, Gumbel-max, logprobs."""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from nanovllm.sample.bitmask import apply_bitmask_
from nanovllm.sample.metadata import SamplingTensors
from nanovllm.sample.noise import device_row_seeds, seeded_exponential
from nanovllm.sample.penalties import apply_penalties
from nanovllm.sample.truncation import apply_truncation, truncation_thresholds


@dataclass
class SamplerOutput:
    """The chosen tokens and, when asked, log-probabilities from the raw logits."""

    token_ids: torch.Tensor  # [num_seqs]
    logprob_token_ids: torch.Tensor | None = None  # [num_seqs, 1 + k]: the chosen token, then the top k
    logprobs: torch.Tensor | None = None  # [num_seqs, 1 + k]
    ranks: torch.Tensor | None = None  # [num_seqs]: the chosen token's rank, 1 = most likely


class Sampler(nn.Module):
    """Picks one token per row of logits.

    Logit biases, penalties, banned tokens and grammar masks change the logits first; greedy rows then take
    the argmax. The others divide by their temperature, apply min-p, top-k and
    top-p, and draw by Gumbel-max: divide the probabilities by Exp(1) noise and
    take the argmax, which samples from the distribution without a multinomial.
    Unseeded rows take noise from the device's generator (one kernel); seeded
    rows from a hash of (seed, position, token), independent of the batch.
    On CUDA a step without seeds, penalties or logit biases works on the logits
    in place, with no copy: bans and grammar masks set them to -inf, a threshold
    search per row finds what truncation keeps, and the Gumbel-max kernel draws
    among the logits at or above each threshold (`SamplingTensors.drawn_by_threshold`);
    the logits may then have changed.
    """

    def forward(self, logits: torch.Tensor, tensors: SamplingTensors | None = None) -> SamplerOutput:
        """Tokens for logits [num_seqs, vocab] (on CUDA they may be overwritten); no tensors: every row greedy."""
        if tensors is None:
            return SamplerOutput(logits.argmax(dim=-1))
        if tensors.temperature_only:
            greedy = tensors.temperatures is None
            token_ids = logits.argmax(dim=-1) if greedy else sample_with_temperatures(logits, tensors.temperatures)
            return self._with_logprobs(logits, token_ids, tensors)
        if logits.is_cuda and tensors.drawn_by_threshold:
            return self._draw_by_threshold(logits, tensors)
        processed = logits.float()
        if tensors.bias_index is not None:
            processed = processed.index_put(
                (tensors.bias_index[0], tensors.bias_index[1]), tensors.bias_values, accumulate=True
            )
        if tensors.penalties is not None:
            processed = apply_penalties(processed, tensors.penalties)
        ban_and_mask_(processed, tensors)
        token_ids = processed.argmax(dim=-1)
        if tensors.temperatures is not None:
            token_ids = torch.where(tensors.temperatures == 0, token_ids, self._draw(processed, tensors))
        return self._with_logprobs(logits, token_ids, tensors)

    def _draw_by_threshold(self, logits: torch.Tensor, tensors: SamplingTensors) -> SamplerOutput:
        ban_and_mask_(logits, tensors)
        thresholds = truncation_thresholds(logits, tensors) if tensors.truncates else None
        temperatures = tensors.temperatures
        if temperatures is None:  # every row greedy: temperature 0 takes the argmax
            temperatures = torch.zeros(logits.size(0), device=logits.device)
        token_ids = sample_with_temperatures(logits, temperatures, thresholds=thresholds)
        return self._with_logprobs(logits, token_ids, tensors)

    @staticmethod
    def _with_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, tensors: SamplingTensors) -> SamplerOutput:
        if tensors.num_logprobs is None:
            return SamplerOutput(token_ids)
        return SamplerOutput(token_ids, *token_logprobs(logits, token_ids, tensors.num_logprobs))

    @staticmethod
    def _draw(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
        temperatures = tensors.temperatures
        scaled = logits / torch.where(temperatures == 0, 1.0, temperatures).unsqueeze(1)
        if tensors.truncates:
            scaled = apply_truncation(scaled, logits, tensors)
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs).exponential_(1).clamp_min_(1e-10)
        if tensors.seeded_rows is not None:
            noise[tensors.seeded_rows] = seeded_exponential(tensors.seeds, tensors.positions, probs.shape[1])
        return (probs / noise).argmax(dim=-1)


def ban_and_mask_(logits: torch.Tensor, tensors: SamplingTensors) -> None:
    """Set to -inf, in place, the logits of tokens that min_tokens bans and that grammar masks forbid."""
    # logits: [num_seqs, vocab]
    if tensors.banned is not None:
        logits.index_put_((tensors.banned[0], tensors.banned[1]), torch.tensor(float("-inf"), device=logits.device))
    if tensors.bitmask is not None:
        apply_bitmask_(logits, tensors.bitmask, tensors.bitmask_rows)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """From raw logits [rows, vocab]: ids [rows, 1 + k] (`token_ids`, then the top k), their
    log-probabilities [rows, 1 + k], and the rank of `token_ids` [rows] (1 = the most likely). On CUDA
    the top k are found among few candidates per row (`top_logprobs`), with no log-softmax of the
    vocabulary."""
    if logits.is_cuda:
        return _token_logprobs_on_device(logits, token_ids, k)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.cat([token_ids.unsqueeze(1), logprobs.topk(k, dim=-1).indices], dim=1)
    values = logprobs.gather(1, ids)
    ranks = (logprobs > values[:, :1]).sum(dim=1) + 1
    return ids, values, ranks


def _token_logprobs_on_device(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    from nanovllm.kernels.triton_top_logits import top_logprobs

    # k = 0 still needs the log-sum-exp and the rank
    top_ids, top_values, log_sum_exp, ranks = top_logprobs(logits, token_ids, max(k, 1))
    chosen = logits.gather(1, token_ids.unsqueeze(1))  # [rows, 1]
    ids = torch.cat([token_ids.unsqueeze(1), top_ids[:, :k]], dim=1)
    values = torch.cat([chosen.float() - log_sum_exp.unsqueeze(1), top_values[:, :k]], dim=1)
    return ids, values, ranks


def sample_with_temperatures(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    thresholds: torch.Tensor | None = None,
) -> torch.Tensor:
    """The common case, argmax for temperature 0 and Gumbel-max otherwise, without a softmax:
    argmax(p / E) with E ~ Exp(1) equals argmax(logits / T - log E). On CUDA two Triton launches whose
    noise comes from per-row `seeds` (drawn by the device's generator when not given); the ids are
    written to `out` when given. With `thresholds` a row draws only among its logits at or above its
    threshold (`truncation_thresholds`)."""
    # logits: [num_seqs, vocab]; temperatures, seeds, thresholds, out: [num_seqs]
    if logits.is_cuda:
        from nanovllm.kernels.triton_sampling import gumbel_max_sample

        if seeds is None:
            seeds = device_row_seeds(logits.size(0), logits.device)
        return gumbel_max_sample(logits, temperatures, seeds, out, thresholds)
    if thresholds is not None:
        logits = logits.masked_fill(logits < thresholds.unsqueeze(1), float("-inf"))
    is_greedy = temperatures == 0
    if is_greedy.all():  # a host tensor: no device to wait for
        ids = logits.argmax(dim=-1)
    else:
        scaled = logits.float() / torch.where(is_greedy, 1.0, temperatures.float()).unsqueeze(1)
        exponential = torch.empty_like(scaled).exponential_(1).clamp_min_(1e-10)
        sampled = (scaled - torch.log(exponential)).argmax(dim=-1)
        ids = torch.where(is_greedy, logits.argmax(dim=-1), sampled)
    return ids if out is None else out.copy_(ids)


def ranks_draw_in_step(device: torch.device) -> bool:
    """Whether tensor-parallel ranks on `device` draw each decode step's tokens among their own slices of the
    vocabulary (`sample_across_ranks`): where the sampling kernel's noise is counted per token id, on CUDA.
    Elsewhere rank 0 gathers the logits and samples them."""
    return device.type == "cuda"


def sample_across_ranks(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    out: torch.Tensor,
    slice_start: int,
    vocab: int,
) -> torch.Tensor:
    """`sample_with_temperatures` on CUDA where each tensor-parallel rank holds the logits of token ids
    slice_start onwards of a `vocab`-wide vocabulary: every rank draws among its own with the whole row's
    noise, and an all-reduce MAX of the draws' keys gives every rank, in `out`, the draw one rank holding
    every logit would make. Every rank calls it (inside the decode graphs too)."""
    # logits: [rows, vocab / ranks]; temperatures, seeds, out: [rows]
    from nanovllm.kernels.triton_sampling import gumbel_max_keys, ids_of_keys

    keys = gumbel_max_keys(logits, temperatures, seeds, slice_start, vocab)
    dist.all_reduce(keys, op=dist.ReduceOp.MAX)
    return ids_of_keys(keys, out)
