"""Triton kernel: temperature sampling by Gumbel-max, reading each logit once.

argmax(softmax(x / T) / E) with E ~ Exp(1) equals argmax(x / T + G) with
G = -log(-log(U)) Gumbel noise, so no softmax pass is needed. Rows with T = 0
take the plain argmax and draw no noise. Layout: logits [rows, vocab] (any
float dtype, last dim contiguous), temperatures [rows] (fp32, or fp64 from the
decode buffers), seed [1] int64. Grid (rows, chunks): a program scores BLOCK
(4096, or the vocabulary if smaller) logits of one row and keeps its best
(score, index); a tiny torch reduction then picks each row's best chunk (ties
go to the lower index, like torch.argmax).
"""

import torch
import triton
import triton.language as tl

_BLOCK = 4096


@triton.jit
def _gumbel_max_chunk_kernel(logits_ptr, temperatures_ptr, seed_ptr, best_score_ptr, best_index_ptr, vocab,
                             stride_row, NUM_CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offsets = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < vocab
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + offsets, mask=mask, other=0.0).to(tl.float32)
    score = x
    temperature = tl.load(temperatures_ptr + row).to(tl.float32)
    if temperature > 0:  # greedy rows draw no noise
        u = tl.rand(tl.load(seed_ptr), row * vocab + offsets)
        score = x / temperature - tl.log(-tl.log(u))
    # NaN ranks highest, as in torch.argmax; left as NaN, the reduction could
    # settle on a masked lane past the vocabulary
    score = tl.where(score != score, float("inf"), score)
    score = tl.where(mask, score, float("-inf"))
    best = tl.argmax(score, 0)
    tl.store(best_score_ptr + row * NUM_CHUNKS + chunk, tl.max(score, 0))
    tl.store(best_index_ptr + row * NUM_CHUNKS + chunk, chunk * BLOCK + best)


def gumbel_max_sample(logits: torch.Tensor, temperatures: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """One token id per row: argmax where the temperature is 0, else a draw from softmax(logits / T).
    The seed is read on the device, so a CUDA graph can draw afresh at each replay."""
    # logits: [rows, vocab]; temperatures: [rows] (any float dtype); seed: [1] int64
    rows, vocab = logits.shape
    assert logits.stride(1) == 1
    block = min(_BLOCK, triton.next_power_of_2(vocab))
    num_chunks = triton.cdiv(vocab, block)
    best_score = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    best_index = torch.empty(rows, num_chunks, dtype=torch.int64, device=logits.device)
    _gumbel_max_chunk_kernel[(rows, num_chunks)](logits, temperatures, seed, best_score, best_index, vocab,
                                                 logits.stride(0), NUM_CHUNKS=num_chunks, BLOCK=block)
    return best_index.gather(1, best_score.argmax(dim=1, keepdim=True)).squeeze(1)
