"""The sum of every tensor-parallel rank's partial output: through buffers the GPUs of one host map for
small messages, NCCL (or gloo on the CPU) otherwise.

At one sequence a decode step all-reduces a few kilobytes twice per layer, where NCCL's latency, not
the link's bandwidth, sets the time. `set_up_peer_all_reduce` allocates one symmetric-memory buffer per
rank (PyTorch's, without NVLink multicast) once the process group exists; `all_reduce` then takes the
Triton kernel for messages that fit it and NCCL for the rest. Every rank chooses alike, since the
choice depends only on the message's size and type, which every rank shares.
"""

import logging
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from nanovllm.kernels.triton_all_reduce import ProductSum

log = logging.getLogger(__name__)

# Largest message the peer kernel takes: on two H200s it beats NCCL up to 8 MB (37.1 against 48.1 us);
# prefill's larger messages go to NCCL.
PEER_MAX_BYTES = 8 << 20
# With more than two ranks, the largest message taken one-shot (two ranks move the same bytes over each
# link either way, and one-shot meets the others fewer times). Not yet measured at four ranks.
ONE_SHOT_MAX_BYTES = 256 << 10
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class PeerAllReduce:
    """This rank's symmetric buffer (for messages up to `max_bytes`), the table of every rank's buffer
    address, and the abort flag its waits read."""

    def __init__(self, device: torch.device, group: dist.ProcessGroup, max_bytes: int = PEER_MAX_BYTES):
        # NVLink multicast can take a host's GPUs out of service; the peer kernel needs none
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        from nanovllm.kernels import triton_all_reduce  # Triton: on CUDA only

        self.kernels = triton_all_reduce
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.max_bytes = max_bytes
        processors = torch.cuda.get_device_properties(device).multi_processor_count
        self.programs = min(triton_all_reduce.MAX_PROGRAMS, processors)
        # one buffer (each rendezvous counts, `set_up_peer_all_reduce`): the all-reduce's pad and areas, then
        # a lane per BLOCK_N for the one-row GEMV's own sums over the ranks
        lanes, lane_bytes = triton_all_reduce.PRODUCT_LANES, triton_all_reduce.LANE_BYTES
        all_reduce_bytes = triton_all_reduce.PAD_BYTES + 2 * max_bytes
        self.buffer, addresses = _symmetric_buffer(all_reduce_bytes + len(lanes) * lane_bytes, device, group)
        addresses = torch.tensor(addresses, dtype=torch.int64)  # [world]
        self.buffers = addresses.to(device)
        self.abort = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # the device reads it through UVA
        lane_starts = all_reduce_bytes + torch.arange(len(lanes), dtype=torch.int64) * lane_bytes
        table = (addresses[None, :] + lane_starts[:, None]).to(device)  # [lanes, world]
        self.gemv_sum = triton_all_reduce.ProductSum(dict(zip(lanes, table)), self.abort, self.rank)
        torch.cuda.synchronize(device)
        dist.barrier(group)  # no rank signals before every pad is clear

    def takes(self, y: torch.Tensor) -> bool:
        return y.dtype in _DTYPES and y.is_contiguous() and y.numel() * y.element_size() <= self.max_bytes

    def __call__(self, y: torch.Tensor, two_shot: bool | None = None) -> torch.Tensor:
        """The sum of every rank's `y`, in place; two-shot or one-shot as asked, else as its size suits."""
        if two_shot is None:
            two_shot = self._two_shot_suits(y)
        return self.kernels.peer_all_reduce(
            y, self.buffers, self.abort, self.rank, self.max_bytes, two_shot, self.programs
        )

    def takes_add_rms_norm(self, y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether the fused sum, residual add and RMSNorm takes these: one-shot sizes, whole rows a program
        holds, all of one dtype."""
        same = residual.dtype == weight.dtype == y.dtype and residual.shape == y.shape and residual.is_contiguous()
        fits = self.takes(y) and y.size(-1) <= self.kernels.MAX_NORM_HIDDEN
        return fits and same and not self._two_shot_suits(y)

    def _two_shot_suits(self, y: torch.Tensor) -> bool:
        return self.world > 2 and y.numel() * y.element_size() > ONE_SHOT_MAX_BYTES

    def add_rms_norm(
        self, y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(sum + residual) * weight, sum + residual) for `y` this rank's part of the sum, written
        over `y` and `residual`."""
        kernel = self.kernels.peer_all_reduce_add_rms_norm
        return kernel(y, residual, weight, eps, self.buffers, self.abort, self.rank, self.max_bytes, self.programs)


def _symmetric_buffer(nbytes: int, device: torch.device, group: dist.ProcessGroup) -> tuple[torch.Tensor, list[int]]:
    """A zeroed buffer of `nbytes` that every rank of `group` maps, and its address on every rank."""
    global _paired_group
    import torch.distributed._symmetric_memory as symm_mem

    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    buffer.zero_()
    addresses = symm_mem.rendezvous(buffer, group.group_name).buffer_ptrs
    _paired_group = id(group)
    return buffer, addresses


_peer: PeerAllReduce | None = None
# the process group this process last paired buffers in (its id)
_paired_group: int | None = None


def _paired_in_an_earlier_group(device: torch.device) -> bool:
    """Whether any rank paired buffers in a process group before this one (a tensor-parallel engine before
    this one, in rank 0's process). PyTorch numbers the rendezvous a process makes, not a group's, so a
    rank that made one before would wait, for a minute, for keys its peers never write (pytorch#196082)."""
    earlier = torch.tensor([int(_paired_group not in (None, id(dist.group.WORLD)))], device=device)
    dist.all_reduce(earlier, op=dist.ReduceOp.MAX)
    return bool(earlier.item())


def set_up_peer_all_reduce(device: torch.device) -> None:
    """With several CUDA ranks on one host, the peer all-reduce for small messages; NCCL alone where the
    GPUs cannot map each other's memory (said once in the log)."""
    global _peer
    if device.type != "cuda" or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    if _paired_in_an_earlier_group(device):
        log.warning(
            "an earlier tensor-parallel engine in this process paired GPU buffers, which PyTorch %s cannot "
            "do twice per process; every all-reduce goes through NCCL",
            torch.__version__,
        )
        return
    try:
        _peer = PeerAllReduce(device, dist.group.WORLD)
    except (RuntimeError, NotImplementedError) as e:
        log.warning("GPUs cannot map each other's buffers (%s); every all-reduce goes through NCCL", e)


def tear_down_peer_all_reduce() -> None:
    """Release the peer buffers (before the process group goes)."""
    global _peer
    _peer = None


def abort_peer_waits() -> None:
    """Release every rank-waiting peer kernel of this process: a rank has died and will never come."""
    if _peer is not None:
        _peer.abort.fill_(1)


def all_reduce(y: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `y`, in place."""
    if _peer is not None and _peer.takes(y):
        return _peer(y)
    dist.all_reduce(y)
    return y


def gemv_ranks_sum(rows: int, features: int, dtype: torch.dtype, device: torch.device) -> "ProductSum | None":
    """What the GEMV of `rows` rows with `features` outputs, each rank's part of a sum, sums them over the
    ranks through, where it does that itself (one row, through the peer buffers); else None."""
    if _peer is None or rows != 1 or device.type != "cuda" or dtype not in _DTYPES:
        return None
    return _peer.gemv_sum if _peer.gemv_sum.takes(features) else None


def summed_in_gemv(y: torch.Tensor) -> bool:
    """Whether `y`, a row-parallel product's output that was left to the layer after it to sum, was summed
    by its GEMV already (`gemv_ranks_sum`)."""
    return gemv_ranks_sum(y.size(0), y.size(-1), y.dtype, y.device) is not None


def all_reduce_add_rms_norm(
    y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For `y` this rank's part of a sum: (RMSNorm(sum + residual) * weight, sum + residual) in one kernel
    where the peer kernel takes them, else None (the caller all-reduces and normalises)."""
    if _peer is not None and _peer.takes_add_rms_norm(y, residual, weight):
        return _peer.add_rms_norm(y, residual, weight, eps)
    return None
