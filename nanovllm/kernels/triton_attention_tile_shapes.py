"""Tile shapes and launch settings of the Triton attention kernels, by head_dim and dtype, within the
shared memory and registers of one Hopper SM (H100/H200: at most 227 KB of shared memory per block, 64K
32-bit registers per SM, at most 255 per thread).

Shared memory. Triton keeps a tl.dot's tensor-core operands in shared memory (Hopper's wgmma reads both
from there; mma.sync stages them there for ldmatrix), and its software pipeline of S = num_stages keeps
S - 1 more K/V tiles loading while one is in use. A program of BLOCK_M query rows over tiles of BLOCK_N
keys, head_dim padded to D, q and the tiles meeting in tl.dot with t bytes a value and the cache holding
c bytes a value (1 for FP8, whose tiles are converted before the dot) holds

    BLOCK_M * D * t                    q, loaded once
  + 2 * BLOCK_N * D * t                this step's K and V operands
  + (S - 1) * 2 * BLOCK_N * D * c      the tiles loading ahead

(`shared_memory_bytes`). That is the wgmma case exactly and an upper bound elsewhere (mma.sync converts an
FP8 tile in registers; the fp32 FMA path stages less). Shapes chosen here keep it within
SHARED_MEMORY_BUDGET = 200 KB, leaving 27 KB of the 227 for what it leaves out: the weights P staged for
the second dot, cross-warp row reductions, layout conversions.

Registers. The fp32 output accumulator [BLOCK_M, D] is spread over the program's 32 * num_warps threads:
BLOCK_M * D / (32 * num_warps) registers each, kept at <= 128 so that the scores, the operand fragments
and the addresses fit in the rest of the 255 without spilling.

head_dim <= 256 keeps the shapes tuned on benchmarks (for fp32 or FP8 decode the estimate exceeds the
budget there, on paths it overstates); head_dim 512 (Gemma 4's global layers) gets shapes derived from the
budgets, each with its arithmetic below. Wider heads are refused.
"""

from dataclasses import dataclass, replace

import torch
import triton

KB = 1024
SHARED_MEMORY_BUDGET = 200 * KB
ACCUMULATOR_REGISTERS = 128  # per thread, of the 255 one may hold
MAX_HEAD_DIM = 512
# decode rows per KV head at head_dim 512: 128 rows of 16-bit tiles asked Triton for 256 KB of shared memory on
# an H200 even unpipelined (the estimate says 192), past the 227 KB an SM gives a block
MAX_ROWS_AT_512 = 64


@dataclass(frozen=True)
class AttentionTiles:
    """One attention kernel's launch shape: query rows a program holds (`block_m`), keys per K/V tile
    (`block_n`), and Triton's num_warps and num_stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def padded_head_dim(head_dim: int) -> int:
    """The width D the kernels hold a head in (a power of 2 for tl.arange); ValueError past MAX_HEAD_DIM."""
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"the Triton attention kernels take head_dim up to {MAX_HEAD_DIM}, not {head_dim}")
    return triton.next_power_of_2(head_dim)


def shared_memory_bytes(tiles: AttentionTiles, head_dim: int, dtype: torch.dtype, quantized: bool) -> int:
    """The shared memory a program of `tiles` holds by the module's estimate, for queries of `dtype` over a
    cache of the same dtype or FP8 (`quantized`)."""
    d = padded_head_dim(head_dim)
    t = 4 if dtype == torch.float32 else 2  # bf16 and fp16 tiles, and fp16 for an FP8 cache of a 16-bit model
    c = 1 if quantized else t
    k_and_v = 2 * tiles.block_n * d
    return tiles.block_m * d * t + k_and_v * t + (tiles.num_stages - 1) * k_and_v * c


def accumulator_registers(tiles: AttentionTiles, head_dim: int) -> int:
    """The registers each thread spends on the fp32 output accumulator [block_m, D]."""
    return tiles.block_m * padded_head_dim(head_dim) // (32 * tiles.num_warps)


def prefill_tiles(head_dim: int, dtype: torch.dtype) -> AttentionTiles:
    """The prefill kernel's shape for queries of `dtype` (the same for a model-dtype or an FP8 cache)."""
    fp32 = dtype == torch.float32
    if padded_head_dim(head_dim) <= 256:
        # 16-bit at 256: 64*256*2 = 32 KB q + 2*64*256*2 = 64 KB K, V + 64 KB ahead = 160 KB;
        # accumulator 64*256 / 128 threads = 128 registers. fp32: 32 KB + 64 KB + 64 KB = 160 KB, 64 registers
        return AttentionTiles(32, 32, 4, 2) if fp32 else AttentionTiles(64, 64, 4, 2)
    if fp32:
        # fp32 is the tests' precision, not a serving one: the smallest safe footprint, unpipelined.
        # 32*512*4 = 64 KB q + 2*16*512*4 = 64 KB K, V = 128 KB; accumulator 32*512 / 256 threads = 64 registers
        return AttentionTiles(32, 16, 8, 1)
    # 64*512*2 = 64 KB q + 2*32*512*2 = 64 KB K, V + 64 KB ahead (32 KB from an FP8 cache) = 192 KB (160 KB);
    # 64-key tiles would take 64 + 128 + 128 = 320 KB. Accumulator 64*512 / 256 threads = 128 registers:
    # 8 warps (two warpgroups, each 64 rows x 256 of the output), as 4 would need 256 each.
    return AttentionTiles(64, 32, 8, 2)


def decode_tiles(head_dim: int, dtype: torch.dtype, quantized: bool, rows: int) -> AttentionTiles:
    """The decode split kernel's shape for `rows` query rows per KV head (GQA group x queries per sequence),
    padded to block_m >= 16 for tl.dot; queries of `dtype` over a model-dtype or an FP8 (`quantized`) cache."""
    block_m = max(16, triton.next_power_of_2(rows))
    if padded_head_dim(head_dim) <= 256:
        # an FP8 tile is half the bytes: twice the keys per tile keep as many bytes in flight
        return AttentionTiles(block_m, 128 if quantized else 64, 4, 2)
    if block_m > MAX_ROWS_AT_512:
        raise ValueError(
            f"decode attention at head_dim {head_dim} holds at most {MAX_ROWS_AT_512} query rows per KV head, "
            f"not {rows} (GQA group x queries per sequence): use fewer speculative tokens"
        )
    fp32 = dtype == torch.float32
    # 32 keys of 512 are the bytes of 64 keys of 256 in flight per tile: for 16-bit tiles 16*512*2 = 16 KB q +
    # 2*32*512*2 = 64 KB K, V + 64 KB ahead (32 KB FP8) = 144 KB (112 KB) at 16 rows, 192 KB (160 KB) at 64.
    # fp32 tiles take 16 keys: 32 KB q + 64 KB + 64 KB (16 KB FP8) = 160 KB (112 KB) at 16 rows.
    # The accumulator: 16*512 / 128 threads = 64 registers; 4 warps hold up to 32 rows, 8 up to 64.
    tiles = AttentionTiles(block_m, 16 if fp32 else 32, 4 if block_m <= 32 else 8, 2)
    if shared_memory_bytes(tiles, head_dim, dtype, quantized) > SHARED_MEMORY_BUDGET:
        # 64 rows of fp32 tiles: 128 KB q + 64 KB K, V, unpipelined = 192 KB
        tiles = replace(tiles, num_stages=1)
    return tiles
