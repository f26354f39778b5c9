"""All-reduce between the GPUs of one host: our peer kernel (one-shot and two-shot) beside NCCL.

One process per GPU. Each size (bf16) is all-reduced 20 times in one CUDA graph, as the decode
graphs run it, and the replay timed; the figure is microseconds per all-reduce. 8 KB is one
Qwen3-8B decode step's hidden state at one sequence, 2 MB at 256 sequences. The limit printed beside
is the time the bytes each rank must send (2 (n-1)/n of the message) take at NVLink's bandwidth per
direction (`--link-gbs`, 450 GB/s on an H100 or H200).

    python benchmarks/all_reduce.py --gpus 2
"""

import argparse
import multiprocessing as mp
import socket

import torch
import torch.distributed as dist

from nanovllm.layers.all_reduce import PEER_MAX_BYTES, PeerAllReduce

SIZES = [1 << 10, 8 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 64 << 20]
PEER_SIZES_UP_TO = 8 << 20  # the peer kernel is timed up to here, whatever size the layers give it (PEER_MAX_BYTES)
CALLS = 20


def time_graph(fn, x: torch.Tensor, replays: int = 20) -> float:
    """Microseconds per call of `fn` on `x`, CALLS calls captured in one graph, median replay."""
    for _ in range(3):
        fn(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn(x)
    times = []
    for _ in range(replays):
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return sorted(times)[len(times) // 2]


def run_rank(rank: int, world: int, port: int, link_gbs: float) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    peer = PeerAllReduce(torch.device("cuda", rank), dist.group.WORLD, max_bytes=PEER_SIZES_UP_TO)
    if rank == 0:
        print(f"{world} x {torch.cuda.get_device_name()}, bf16, {CALLS} all-reduces per graph replay, us each")
        print(f"the layers take the peer kernel up to {PEER_MAX_BYTES >> 10} KB, NCCL above")
        print(f"{'size':>8} {'NCCL':>8} {'one-shot':>9} {'two-shot':>9} {'link limit':>11}")
    for nbytes in SIZES:
        x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        nccl = time_graph(dist.all_reduce, x)
        shots = ["-", "-"]
        if nbytes <= PEER_SIZES_UP_TO:
            for i, two_shot in enumerate((False, True)):
                us = time_graph(lambda y, t=two_shot: peer(y, two_shot=t), x)
                shots[i] = f"{us:.1f}"
        limit = nbytes * 2 * (world - 1) / world / (link_gbs * 1e3)
        if rank == 0:
            label = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
            print(f"{label:>8} {nccl:8.1f} {shots[0]:>9} {shots[1]:>9} {limit:11.2f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--link-gbs", type=float, default=450.0, help="NVLink GB/s per direction")
    args = parser.parse_args()
    if args.gpus < 2:
        raise SystemExit("needs at least 2 CUDA GPUs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    ranks = [context.Process(target=run_rank, args=(r, args.gpus, port, args.link_gbs)) for r in range(args.gpus)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()


if __name__ == "__main__":
    main()
