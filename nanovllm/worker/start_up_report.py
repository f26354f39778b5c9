"""What a model runner measured while it started, for the front end's start-up log.

This module imports nothing heavy: the report travels to the front end inside
the engine core's start-up info, across the process boundary when the core
runs in a process of its own.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class StartUpReport:
    """Rank 0's figures: the device it runs on by name, the bytes its share of the weights (parameters and
    buffers) takes, the seconds it took to build the model and load its weights, the bytes of its KV cache
    and of its recurrent-state cache (0 without recurrent layers), and the seconds it took to capture the
    decode step's CUDA graphs (None where none were captured)."""

    device_name: str
    weights_bytes: int
    load_seconds: float
    kv_cache_bytes: int
    state_cache_bytes: int
    graph_capture_seconds: float | None
