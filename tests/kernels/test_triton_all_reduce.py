"""The peer all-reduce kernel: ranks as processes that map each other's buffers (shared memory on the CPU,
under Triton's interpreter), against the sum, three times: later calls meet the counts the earlier left (as
a replayed CUDA graph does), and the third writes the area the first did. Also the sum fused with the
residual add and the RMSNorm, between plain sums on the same buffers."""

import multiprocessing as mp

import pytest
import torch

from nanovllm.kernels.triton_all_reduce import PAD_BYTES, peer_all_reduce, peer_all_reduce_add_rms_norm
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


def _spawn_ranks(target, parts: list[torch.Tensor], args: tuple) -> None:
    """`target(rank, buffers, abort, parts, *args)` in a process per rank, over shared buffers."""
    world, nbytes = len(parts), parts[0].numel() * parts[0].element_size()
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
