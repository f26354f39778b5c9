"""Tensor-parallel state: the split layers are built for, the rendezvous, and the process group.

Layers read `tp_rank()`/`tp_size()` once, while they are built inside
`tensor_parallel(rank, size)`; outside it they see rank 0 of 1. Keeping the
split out of the global process group lets a one-rank engine live beside a
tensor-parallel one in the same process.
"""

import os
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

_rank, _size = 0, 1

# How long rank 0 waits for the workers to reach the rendezvous; their start-up
# is a Python import, not model loading, so a minute is generous.
RENDEZVOUS_TIMEOUT = timedelta(seconds=60)
# How long the nodes of a multi-node engine wait for each other: they are started by hand, or by a
# scheduler, one after the other, and each loads its share of the model first.
NODES_TIMEOUT = timedelta(minutes=10)


@contextmanager
def tensor_parallel(rank: int, size: int):
    """Layers built inside this block hold rank `rank`'s share of a `size`-way split."""
    global _rank, _size
    saved = _rank, _size
    _rank, _size = rank, size
    try:
        yield
    finally:
        _rank, _size = saved


def tp_rank() -> int:
    return _rank


def tp_size() -> int:
    return _size


def kv_heads_per_rank(num_kv_heads: int, size: int) -> tuple[int, int]:
    """(KV heads each of `size` ranks holds, ranks that hold each of them): the heads split evenly, or, with
    more ranks than heads (a multiple of them), one head a rank, each repeated on size / num_kv_heads ranks,
    as the query heads of its group are split among them."""
    if num_kv_heads % size == 0:
        return num_kv_heads // size, 1
    if size % num_kv_heads == 0:
        return 1, size // num_kv_heads
    raise ValueError(
        f"tensor_parallel_size ({size}) must divide the model's KV heads ({num_kv_heads}) or be a multiple of them"
    )


def check_divisible(model_config, size: int) -> None:
    """ValueError naming every dimension of `model_config` (a ModelConfig) that `size` ranks cannot split evenly:
    KV heads may also be fewer than the ranks (a multiple of them), and are then repeated, except in Gemma 4."""
    dims = {
        "attention heads (num_attention_heads)": model_config.num_attention_heads,
        "vocabulary (vocab_size)": model_config.vocab_size,
    }
    kv_heads = model_config.num_key_value_heads
    if kv_heads % size and (size % kv_heads or model_config.gemma4 is not None):
        multiple = "" if model_config.gemma4 is not None else ", or be a multiple of them"
        dims[f"KV heads (num_key_value_heads{multiple})"] = kv_heads
    # an MLP's width is split, a dense one's where some layer has one, and every expert's where some has experts
    if len(model_config.moe_layers) < model_config.num_hidden_layers:
        dims["MLP width (intermediate_size)"] = model_config.intermediate_size
    if model_config.num_experts:
        dims["expert MLP width (moe_intermediate_size)"] = model_config.moe_intermediate_size
    # layers of other KV heads than num_key_value_heads (Gemma 4's global ones)
    for heads in sorted({getattr(spec, "num_kv_heads", 0) for spec in model_config.layer_specs} - {0}):
        if heads != model_config.num_key_value_heads:
            dims["KV heads of the global layers (num_global_key_value_heads)"] = heads
    if model_config.linear_num_key_heads:  # Gated DeltaNet layers, split by their heads
        dims["linear-attention key heads (linear_num_key_heads)"] = model_config.linear_num_key_heads
        dims["linear-attention value heads (linear_num_value_heads)"] = model_config.linear_num_value_heads
    uneven = [f"{name} = {value}" for name, value in dims.items() if value % size]
    if uneven:
        raise ValueError(
            f"tensor_parallel_size={size} must divide the model's {', '.join(uneven)}; pick a size that does"
        )


def rendezvous_address(master_port: int, master_addr: str = "") -> tuple[str, int]:
    """Where ranks meet: `master_addr`, else $MASTER_ADDR, else 127.0.0.1; and `master_port`, else
    $MASTER_PORT, else 0 (rank 0 takes a free port, so engines on one host never collide)."""
    host = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = master_port or int(os.environ.get("MASTER_PORT", "0"))
    return host, port


def rendezvous_store(host: str, port: int, is_master: bool, timeout: timedelta = RENDEZVOUS_TIMEOUT) -> dist.TCPStore:
    """The key-value store ranks meet at; rank 0 serves it, the workers connect (trying for `timeout`)."""
    try:
        return dist.TCPStore(host, port, is_master=is_master, wait_for_workers=False, timeout=timeout)
    except (RuntimeError, OSError) as e:
        role = "serve" if is_master else "reach"
        raise RuntimeError(
            f"could not {role} the tensor-parallel rendezvous at {host}:{port} ({e}); "
            f"choose another master_port (or MASTER_PORT), or 0 for a free one"
        ) from e


def init_process_group(store: dist.Store, rank: int, size: int, device: torch.device) -> None:
    """Join the `size`-rank group: NCCL for CUDA tensors, gloo for CPU ones."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        # On a peer's failure abort the communicators but leave this process alive (PyTorch's
        # default ends it), so that rank 0 can report the failure to its caller.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=size, device_id=device if device.type == "cuda" else None
    )


def share_cpu_cores(size: int) -> None:
    """Give this rank its share of the CPU cores: `size` ranks on this machine each running on every
    core slow each other down several-fold."""
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_ranks_min(value: int, device: torch.device) -> int:
    """The smallest `value` over the ranks of the group."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
