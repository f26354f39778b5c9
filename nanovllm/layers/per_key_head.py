"""The shard id of a checkpoint tensor whose rows are grouped per key head (imports no torch, so that family
files, which read configs without torch, can name it)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class PerKeyHead:
    """The shard id of a checkpoint tensor that fills several shards of a Gated DeltaNet's fused projection
    with its rows grouped per key head: for each key head, its rows of each of `shards` in turn (Qwen3-Next's
    in_proj_qkvz: a key head's q, k, then the v and z of the value heads that read it), rather than shard
    after shard over all heads."""

    shards: tuple[str, ...]
