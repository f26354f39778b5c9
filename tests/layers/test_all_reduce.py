"""The all-reduce layers call: on two GPUs, the peer kernel (one-shot and two-shot) and the size-chosen path
against NCCL's result, eager and replayed in a CUDA graph, from 1 KB to 64 MB; and the sum fused with the
residual add and the RMSNorm against NCCL's sum, added and normalised by torch; and one-row products that
sum their outputs over the ranks themselves against NCCL's sum of their parts. (Without peers it is the
process group's own all-reduce, which the tensor-parallel tests run on the CPU.)"""

import multiprocessing as mp

import pytest
import torch
import torch.distributed as dist

from nanovllm.layers import all_reduce as all_reduce_module
from nanovllm.layers.all_reduce import PeerAllReduce, all_reduce, all_reduce_add_rms_norm, set_up_peer_all_reduce
from nanovllm.layers.layernorm import rms_norm

from helpers.ports import free_port

SIZES = [1 << 10, 8 << 10, 64 << 10, 2 << 20, 4 << 20, 8 << 20, 64 << 20]  # bytes
NORM_SHAPES = [(1, 4096), (7, 5000), (256, 4096)]  # (rows, hidden): one sequence, odd sizes, 2 MB in bf16
EPS = 1e-6
FORCED_UP_TO = 8 << 20  # both paths are checked up to here, whatever size the layers give the kernel


def _cases(dtype: torch.dtype, rank: int, nbytes: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rank * 7919 + nbytes)
    return torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size(), generator=generator).to(dtype)


def _graphed(fn, x: torch.Tensor) -> torch.Tensor:
    """`fn(x)` captured in a CUDA graph, replayed on a fresh copy of x."""
    static = x.clone()
    fn(static.clone())  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(static)
    static.copy_(x)
    graph.replay()
    return static


def _check_rank(rank: int, world: int, port: int, failures) -> None:
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        peer = PeerAllReduce(torch.device("cuda", rank), dist.group.WORLD, max_bytes=FORCED_UP_TO)
        set_up_peer_all_reduce(torch.device("cuda", rank))
        assert all_reduce_module._peer is not None
        for dtype in (torch.bfloat16, torch.float32):
            for nbytes in SIZES:
                x = _cases(dtype, rank, nbytes).cuda()
                expected = x.clone()
                dist.all_reduce(expected)
                paths = {"chosen": all_reduce}
                if nbytes <= FORCED_UP_TO:
                    paths["one-shot"] = lambda y: peer(y, two_shot=False)
                    paths["two-shot"] = lambda y: peer(y, two_shot=True)
                for name, fn in paths.items():
                    for mode, got in (("eager", fn(x.clone())), ("graph", _graphed(fn, x))):
                        if not torch.equal(got, expected):
                            err = (got.float() - expected.float()).abs().max().item()
                            failures.append(f"rank {rank} {dtype} {nbytes} B {name} {mode}: max error {err}")
            for rows, hidden in NORM_SHAPES:
                _check_fused_norm(rank, dtype, rows, hidden, failures)
            _check_gemv_sums(rank, dtype, failures)
        torch.cuda.synchronize()
    except Exception as e:  # reported by the parent
        failures.append(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        all_reduce_module.tear_down_peer_all_reduce()
        if dist.is_initialized():
            dist.destroy_process_group()


def _check_fused_norm(rank: int, dtype: torch.dtype, rows: int, hidden: int, failures) -> None:
    x = _cases(dtype, rank, rows * hidden * torch.tensor([], dtype=dtype).element_size()).view(rows, hidden).cuda()
    generator = torch.Generator().manual_seed(rows + hidden)  # the residual and weight every rank holds alike
    residual = torch.randn(rows, hidden, generator=generator).to(dtype).cuda()
    weight = (torch.rand(hidden, generator=generator) + 0.5).to(dtype).cuda()
    total = x.clone()
    dist.all_reduce(total)
    h = total + residual
    expected = rms_norm(h, weight, EPS)

    def fused(y, r):
        out = all_reduce_add_rms_norm(y, r, weight, EPS)
        assert out is not None, "the peer kernel did not take the fused norm"
        return out

    got = {"eager": fused(x.clone(), residual.clone())}
    static_x, static_r = x.clone(), residual.clone()
    fused(static_x.clone(), static_r.clone())  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused(static_x, static_r)
    static_x.copy_(x)
    static_r.copy_(residual)
    graph.replay()
    got["graph"] = (static_x, static_r)
    tolerance = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    for mode, (y, r) in got.items():
        try:
            assert torch.equal(r, h), "h = sum + residual differs"
            torch.testing.assert_close(y, expected, **tolerance)
        except AssertionError as e:
            failures.append(f"rank {rank} {dtype} fused norm {rows}x{hidden} {mode}: {e}")


def _check_gemv_sums(rank: int, dtype: torch.dtype, failures) -> None:
    """One row's plain and gated products of one rank's share of Qwen3-8B's o and down at two ranks, summed
    over the ranks by the GEMV itself, against the GEMV's parts summed by NCCL: eager, then in a graph
    replayed twice (the second replay takes the other areas)."""
    from nanovllm.kernels.triton_gemv import gated_gemv, gemv

    generator = torch.Generator().manual_seed(rank)
    x, o = torch.randn(1, 2048, generator=generator), torch.randn(4096, 2048, generator=generator) / 45
    gate_up, down = torch.randn(1, 12288, generator=generator), torch.randn(4096, 6144, generator=generator) / 78
    x, o, gate_up, down = (t.to(dtype).cuda() for t in (x, o, gate_up, down))
    ranks_sum = all_reduce_module.gemv_ranks_sum(1, 4096, dtype, x.device)
    assert ranks_sum is not None, "the GEMV does not sum a one-row product"
    products = {
        "plain": lambda summed: gemv(x, o, ranks_sum=summed),
        "gated": lambda summed: gated_gemv(gate_up, down, "silu", ranks_sum=summed),
    }
    for name, product in products.items():
        expected = product(None)
        dist.all_reduce(expected)
        got = {"eager": product(ranks_sum)}
        product(ranks_sum)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = product(ranks_sum)
        for replay in ("graph", "graph again"):
            static.zero_()
            graph.replay()
            got[replay] = static.clone()
        for mode, y in got.items():
            if not torch.equal(y, expected):
                err = (y.float() - expected.float()).abs().max().item()
                failures.append(f"rank {rank} {dtype} {name} GEMV sum {mode}: max error {err}")


@pytest.mark.gpu
@pytest.mark.whole_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_gpus_sum_as_nccl_does():
    context = mp.get_context("spawn")
    failures = context.Manager().list()
    port = free_port()
    processes = [context.Process(target=_check_rank, args=(r, 2, port, failures)) for r in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(300)
        if p.is_alive():
            p.kill()
            failures.append("a rank hung")
    # two ranks add each pair once, in fp32, rounded once: the same bits as NCCL
    assert not list(failures)
