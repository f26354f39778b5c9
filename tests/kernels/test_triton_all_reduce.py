"""The peer all-reduce kernel: ranks as processes that map each other's buffers (shared memory on the CPU,
under Triton's interpreter), against the sum, three times: later calls meet the counts the earlier left (as
a replayed CUDA graph does), and the third writes the area the first did."""

import multiprocessing as mp

import pytest
import torch

from nanovllm.kernels.triton_all_reduce import PAD_BYTES, peer_all_reduce

_TIMEOUT_S = 240

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


def _run_ranks(world: int, n: int, dtype: torch.dtype, two_shot: bool) -> list[torch.Tensor]:
    parts = _parts(world, n, dtype)
    item = parts[0].element_size()
    buffers = [torch.zeros(PAD_BYTES + 2 * n * item, dtype=torch.uint8).share_memory_() for _ in range(world)]
    abort = torch.zeros(1, dtype=torch.int32).share_memory_()
    results = [torch.zeros(3, n, dtype=dtype).share_memory_() for _ in range(world)]
    context = mp.get_context("spawn")
    processes = [
        context.Process(target=_rank_main, args=(r, buffers, abort, parts, two_shot, results)) for r in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(_TIMEOUT_S)
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung in the all-reduce"
    assert all(p.exitcode == 0 for p in processes)
    return results, parts


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
