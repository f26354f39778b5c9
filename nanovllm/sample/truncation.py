"""Truncation sampling: min-p, top-k and top-p keep a head of the distribution, row by row.

On CUDA one threshold per row says what it keeps, found by the Triton kernels
of `kernels/triton_top_logits.py`; on the CPU a sort finds the same sets.
"""

import torch

from nanovllm.sample.metadata import SamplingTensors


def truncation_thresholds(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """Per row, the smallest logit that its min-p, top-k and top-p keep at its temperature (-inf: every
    logit), on CUDA; a feature no row uses is off for every row."""
    # logits: [num_seqs, vocab] -> [num_seqs] float32
    from nanovllm.kernels.triton_top_logits import truncation_thresholds as search

    rows, vocab = logits.shape
    off = lambda value, dtype=torch.float32: torch.full((rows,), value, dtype=dtype, device=logits.device)
    return search(
        logits,
        tensors.temperatures,
        off(vocab, torch.int64) if tensors.top_k is None else tensors.top_k,
        off(1.0) if tensors.top_p is None else tensors.top_p,
        off(0.0) if tensors.min_p is None else tensors.min_p,
    )


def apply_truncation(scaled: torch.Tensor, logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """`scaled` (the logits over each row's temperature) with -inf where min-p, top-k or top-p drop a token:
    on CUDA below each row's threshold in `logits`, on the CPU by a sort of `scaled`."""
    # scaled, logits: [num_seqs, vocab]
    if logits.is_cuda:
        return scaled.masked_fill(logits < truncation_thresholds(logits, tensors).unsqueeze(1), float("-inf"))
    if tensors.min_p is not None:
        scaled = apply_min_p(scaled, tensors.min_p)
    if tensors.top_k is not None or tensors.top_p is not None:
        scaled = apply_top_k_top_p(scaled, tensors.top_k, tensors.top_p)
    return scaled


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability."""
    # logits: [num_seqs, vocab]; min_p: [num_seqs], 0 = off
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Keep the k most likely tokens, then the smallest set whose probability reaches p.

    One sort serves both. top_k: [num_seqs] int64 (vocab size = off); top_p:
    [num_seqs] float32 (1 = off); either may be None when no row uses it.
    Tokens tied with the k-th are kept.
    """
    # ascending, so that top-p drops a prefix whose mass is at most 1 - p
    sorted_logits, order = logits.sort(dim=-1)
    vocab_size = logits.shape[-1]
    if top_k is not None:
        kth = sorted_logits.gather(1, (vocab_size - top_k).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p.unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
