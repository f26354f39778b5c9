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

import torch
import torch.distributed as dist

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
        import torch.distributed._symmetric_memory as symm_mem

        from nanovllm.kernels import triton_all_reduce  # Triton: on CUDA only

        self.kernels = triton_all_reduce
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.max_bytes = max_bytes
        processors = torch.cuda.get_device_properties(device).multi_processor_count
        self.programs = min(triton_all_reduce.MAX_PROGRAMS, processors)
        self.buffer = symm_mem.empty(triton_all_reduce.PAD_BYTES + 2 * max_bytes, dtype=torch.uint8, device=device)
        self.buffer.zero_()  # the pads start clear
        handle = symm_mem.rendezvous(self.buffer, group.group_name)
        self.buffers = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device)  # [world]
        self.abort = torch.zeros(1, dtype=torch.int32, pin_memory=True)  # the device reads it through UVA
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


_peer: PeerAllReduce | None = None


def set_up_peer_all_reduce(device: torch.device) -> None:
    """With several CUDA ranks on one host, the peer all-reduce for small messages; NCCL alone where the
    GPUs cannot map each other's memory (said once in the log)."""
    global _peer
    if device.type != "cuda" or not dist.is_initialized() or dist.get_world_size() == 1:
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


def all_reduce_add_rms_norm(
    y: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For `y` this rank's part of a sum: (RMSNorm(sum + residual) * weight, sum + residual) in one kernel
    where the peer kernel takes them, else None (the caller all-reduces and normalises)."""
    if _peer is not None and _peer.takes_add_rms_norm(y, residual, weight):
        return _peer.add_rms_norm(y, residual, weight, eps)
    return None
