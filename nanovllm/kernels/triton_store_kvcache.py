"""Triton kernel: write this step's K/V into the paged cache at the slot mapping.

Layout: k, v: [tokens, kv_heads, head_dim] (rows may be strided, each row's
kv_heads * head_dim values contiguous); k_cache, v_cache: [num_blocks,
block_size, kv_heads, head_dim], contiguous, so slot s starts at
s * kv_heads * head_dim. Grid: (tokens,); a program copies one token's K and V
row, or nothing when its slot is -1 (a padded CUDA-graph slot or a token whose
K/V is already cached).
"""

import torch
import triton
import triton.language as tl

from nanovllm.kernels.triton_pdl import pdl_launch, wait_for_previous_kernel


@triton.jit
def _store_kvcache_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                          stride_k, stride_v, ROW: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offsets = tl.arange(0, BLOCK)
    mask = offsets < ROW
    k = tl.load(k_ptr + token * stride_k + offsets, mask=mask)
    v = tl.load(v_ptr + token * stride_v + offsets, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + offsets, k, mask=mask)
    tl.store(v_cache_ptr + slot * ROW + offsets, v, mask=mask)


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Copy k[t], v[t] to flat cache slot `slot_mapping[t]`; slot -1 is skipped."""
    # k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens]
    num_tokens, kv_heads, head_dim = k.shape
    row = kv_heads * head_dim
    assert k.stride(1) == head_dim and k.stride(2) == 1 and v.stride(1) == head_dim and v.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.size(-1) * k_cache.size(-2) == row
    _store_kvcache_kernel[(num_tokens,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                         ROW=row, BLOCK=triton.next_power_of_2(row),
                                         **pdl_launch(k.device))
