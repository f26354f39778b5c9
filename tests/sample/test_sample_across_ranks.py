"""Temperature sampling with the vocabulary split over tensor-parallel ranks: each rank draws among its own
logits and the ranks agree on the draw one rank holding every logit makes (over gloo under the Triton
interpreter on the CPU; over NCCL on two GPUs)."""

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

from helpers.ports import free_port

pytest.importorskip("triton")
from nanovllm.kernels.triton_sampling import gumbel_max_sample  # noqa: E402
from nanovllm.sample.sampler import sample_across_ranks  # noqa: E402

ROWS, VOCAB = 5, 9000  # three 4096-wide chunks, which the slices of two or three ranks cut
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")],
    ),
]


def _draw_on_rank(rank: int, world: int, port: int, device: str, inputs: tuple, results: torch.Tensor) -> None:
    """Rank `rank`'s part: its slice of the logits, drawn across the ranks; the ids land in results[rank]."""
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        device = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
        logits, temperatures, seeds = (t.to(device) for t in inputs)
        start, end = rank * VOCAB // world, (rank + 1) * VOCAB // world
        out = torch.full((ROWS,), -1, dtype=torch.int64, device=device)
        sample_across_ranks(logits[:, start:end].contiguous(), temperatures, seeds, out, start, VOCAB)
        results[rank].copy_(out.cpu())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("device", DEVICES)
def test_every_rank_gets_the_draw_of_the_whole_vocabulary(world, device):
    if device == "cuda" and world > torch.cuda.device_count():
        pytest.skip(f"needs {world} CUDA GPUs")
    torch.manual_seed(0)
    logits = torch.randn(ROWS, VOCAB) * 4
    temperatures = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.0])
    seeds = torch.tensor([3, 4, 5, 6, 7])
    results = torch.full((world, ROWS), -1, dtype=torch.int64).share_memory_()
    port = free_port()
    context = mp.get_context("spawn")
    inputs = (logits, temperatures, seeds)
    processes = [
        context.Process(target=_draw_on_rank, args=(r, world, port, device, inputs, results)) for r in range(world)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(120)
    assert all(p.exitcode == 0 for p in processes)
    on_device = "cuda" if device == "cuda" else "cpu"
    whole = gumbel_max_sample(logits.to(on_device), temperatures.to(on_device), seeds.to(on_device)).cpu()
    assert torch.equal(results, whole.expand(world, -1))
    assert results[0, 0] == logits[0].argmax()  # the greedy row
