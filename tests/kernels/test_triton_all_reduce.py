"""The peer all-reduce kernel: ranks as processes that map each other's buffers (shared memory on the CPU,
under Triton's interpreter), against the sum, three times: later calls meet the counts the earlier left (as
a replayed CUDA graph does), and the third writes the area the first did. Also the sum fused with the
residual add and the RMSNorm, between plain sums on the same buffers; and the one-row products that sum
their outputs over the ranks themselves."""

import multiprocessing as mp

import pytest
import torch
import torch.nn.functional as F

from nanovllm.kernels.triton_all_reduce import (
    LANE_BYTES,
    PAD_BYTES,
    PRODUCT_LANES,
    ProductSum,
    peer_all_reduce,
    peer_all_reduce_add_rms_norm,
)
from nanovllm.kernels.triton_gemv import BLOCKS, FP8_BLOCKS, SHAPE_BLOCKS, gated_gemv, gemv
from nanovllm.layers.layernorm import rms_norm

_TIMEOUT_S = 240
_EPS = 1e-6

# the buffers are host memory, which only the interpreter reaches
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs tests/layers/test_all_reduce.py")


def _parts(world: int, n: int, dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(n + world)
    return [torch.randn(n, generator=generator).to(dtype) for _ in range(world)]


def _rank_main(rank, buffers, abort, parts, two_shot, results):
    # buffers: every rank's shared buffer, mapped at this process's own addresses
    table = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    area = parts[rank].numel() * parts[rank].element_size()
    for call in range(3):  # later calls find the pads the earlier left, and take the areas in turn
        x = parts[rank].clone() * (call + 1)
        peer_all_reduce(x, table, abort, rank, area, two_shot)
        results[rank][call].copy_(x)


def _norm_rank_main(rank, buffers, abort, parts, results, residual, weight):
    # calls alternate: fused sum + add + norm, plain sum, fused again, as the layers of a model call them
    table = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    area = parts[rank].numel() * parts[rank].element_size()
    for call in range(3):
        x = parts[rank].clone() * (call + 1)
        if call == 1:
            results[rank][call][0].copy_(peer_all_reduce(x, table, abort, rank, area))
            continue
        h = residual.clone()
        y, h = peer_all_reduce_add_rms_norm(x, h, weight, _EPS, table, abort, rank, area)
        results[rank][call][0].copy_(y)
        results[rank][call][1].copy_(h)


def _run_ranks(world: int, n: int, dtype: torch.dtype, two_shot: bool) -> list[torch.Tensor]:
    parts = _parts(world, n, dtype)
    results = [torch.zeros(3, n, dtype=dtype).share_memory_() for _ in range(world)]
    _spawn_ranks(_rank_main, parts, (two_shot, results))
    return results, parts


def _spawn_ranks(target, parts: list, args: tuple, buffers: list[torch.Tensor] | None = None) -> None:
    """`target(rank, buffers, abort, parts, *args)` in a process per rank, over shared buffers (by default
    each of a pad and two areas the size of a part)."""
    world = len(parts)
    if buffers is None:
        nbytes = parts[0].numel() * parts[0].element_size()
        buffers = [torch.zeros(PAD_BYTES + 2 * nbytes, dtype=torch.uint8).share_memory_() for _ in range(world)]
    abort = torch.zeros(1, dtype=torch.int32).share_memory_()
    context = mp.get_context("spawn")
    processes = [context.Process(target=target, args=(r, buffers, abort, parts, *args)) for r in range(world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(_TIMEOUT_S)
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung in the all-reduce"
    assert all(p.exitcode == 0 for p in processes)


@pytest.mark.parametrize(
    "world, n, two_shot",
    [(2, 37, False), (2, 20000, False), (3, 4500, True), (4, 20000, True)],
    ids=["one-shot-tiny", "one-shot-3-programs", "two-shot-3-ranks", "two-shot-4-ranks"],
)
def test_every_rank_gets_the_sum(world, n, two_shot):
    results, parts = _run_ranks(world, n, torch.float32, two_shot)
    expected = torch.stack(parts).sum(0)
    for rank in range(world):
        for call in range(3):
            torch.testing.assert_close(results[rank][call], expected * (call + 1), rtol=1e-6, atol=1e-5)
        assert torch.equal(results[rank], results[0]), "ranks disagree on the bits"


def test_an_abort_releases_a_rank_whose_peer_never_comes():
    buffers = [torch.zeros(PAD_BYTES + 2 * 64, dtype=torch.uint8) for _ in range(2)]
    table = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    abort = torch.ones(1, dtype=torch.int32)
    x = torch.ones(16)
    peer_all_reduce(x, table, abort, rank=0, area_bytes=x.nbytes)  # returns although rank 1 never calls


@pytest.mark.parametrize("world, rows, hidden", [(2, 300, 48), (3, 5, 130)], ids=["2-ranks-3-tiles", "3-ranks-wide"])
def test_the_fused_norm_sums_adds_and_normalises_between_plain_sums(world, rows, hidden):
    parts = [p.view(rows, hidden) for p in _parts(world, rows * hidden, torch.float32)]
    generator = torch.Generator().manual_seed(7)
    residual = torch.randn(rows, hidden, generator=generator)
    weight = torch.rand(hidden, generator=generator) + 0.5
    results = [torch.zeros(3, 2, rows, hidden).share_memory_() for _ in range(world)]
    _spawn_ranks(_norm_rank_main, parts, (results, residual, weight))
    total = torch.stack(parts).sum(0)
    for call in (0, 2):
        h = total * (call + 1) + residual
        for rank in range(world):
            torch.testing.assert_close(results[rank][call][1], h, rtol=1e-6, atol=1e-5)
            torch.testing.assert_close(results[rank][call][0], rms_norm(h, weight, _EPS), rtol=1e-5, atol=1e-5)
            assert torch.equal(results[rank][call], results[0][call]), "ranks disagree on the bits"
    for rank in range(world):
        torch.testing.assert_close(results[rank][1][0], total * 2, rtol=1e-6, atol=1e-5)


def _product_rank_main(rank, buffers, abort, parts, results, gate_ups, downs):
    # parts[rank]: (x [1, K_r], W [N, K_r]), this rank's columns of a row-parallel product; the calls
    # alternate plain and gated products, which take different lanes, and come back to each lane's areas
    lanes = {n: torch.tensor([b.data_ptr() + i * LANE_BYTES for b in buffers]) for i, n in enumerate(PRODUCT_LANES)}
    ranks_sum = ProductSum(lanes, abort, rank)
    x, weight = parts[rank]
    for call in range(3):
        results[rank][call].copy_(gemv(x * (call + 1), weight, ranks_sum=ranks_sum)[0])
        results[rank][3 + call].copy_(
            gated_gemv(gate_ups[rank] * (call + 1), downs[rank], "silu", ranks_sum=ranks_sum)[0]
        )


@pytest.mark.parametrize("world", [2, 3])
def test_one_row_products_sum_their_outputs_over_the_ranks(world):
    n, k, inner = 40, 24, 16  # outputs, and each rank's columns of the plain and the gated product
    generator = torch.Generator().manual_seed(world)
    parts = [(torch.randn(1, k, generator=generator), torch.randn(n, k, generator=generator)) for _ in range(world)]
    gate_ups = [torch.randn(1, 2 * inner, generator=generator) for _ in range(world)]
    downs = [torch.randn(n, inner, generator=generator) for _ in range(world)]
    results = [torch.zeros(6, n).share_memory_() for _ in range(world)]
    buffers = [torch.zeros(len(PRODUCT_LANES) * LANE_BYTES, dtype=torch.uint8).share_memory_() for _ in range(world)]
    _spawn_ranks(_product_rank_main, parts, (results, gate_ups, downs), buffers)
    plain = sum(x @ w.T for x, w in parts)[0]
    for call in range(3):
        scaled = [g * (call + 1) for g in gate_ups]
        gated = sum((F.silu(g[:, :inner]) * g[:, inner:]) @ d.T for g, d in zip(scaled, downs))[0]
        for rank in range(world):
            torch.testing.assert_close(results[rank][call], plain * (call + 1), rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(results[rank][3 + call], gated, rtol=1e-5, atol=1e-4)
    for rank in range(world):
        assert torch.equal(results[rank], results[0]), "ranks disagree on the bits"


def test_every_block_n_of_the_one_row_product_has_a_lane():
    widths = {block_n for table in (BLOCKS, FP8_BLOCKS, SHAPE_BLOCKS) for block_n, _, _ in table.values()}
    assert widths <= set(PRODUCT_LANES)
