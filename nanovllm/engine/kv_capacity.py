"""What the KV cache holds, in the terms a user sizes it by: sequences at max_model_len, tokens per cache group,
and the longest request it can hold alone. On a model with recurrent layers each running sequence also
holds a state slot (its live state; a second for its latest snapshot where one is left), which can bound the
sequences too."""

from nanovllm.config import Config
from nanovllm.engine.messages import KVGroupCapacity


def max_concurrency(config: Config, num_blocks: int, num_state_slots: int) -> float:
    """Sequences of max_model_len tokens the pool of `num_blocks` blocks (and, on a model with recurrent
    layers, of `num_state_slots` state slots, one per sequence) holds at once, while they decode."""
    per_sequence = config.kv_layout.blocks_held(config.context_len, config.kv_block_size, config.kv_lookback)
    by_blocks = num_blocks / per_sequence
    return min(by_blocks, num_state_slots) if config.kv_layout.has_state else by_blocks


def group_capacities(config: Config, num_blocks: int, num_state_slots: int) -> list[KVGroupCapacity]:
    """The tokens each kind of cache group holds when the caches hold `max_concurrency` sequences of
    max_model_len tokens (groups of one spec, cut to the pool's block width, are counted as one)."""
    concurrency = max_concurrency(config, num_blocks, num_state_slots)
    capacities: dict[str, KVGroupCapacity] = {}
    for group in config.kv_layout.groups:
        held = group.blocks_held(config.context_len, config.kv_block_size, config.kv_lookback)
        kind = "full attention" if group.window is None else f"sliding window {group.window}"
        layers = len(group.layers) + (capacities[kind].num_layers if kind in capacities else 0)
        capacities[kind] = KVGroupCapacity(kind, layers, int(concurrency * held) * config.kv_block_size)
    return list(capacities.values())


def longest_request(config: Config, num_blocks: int) -> int:
    """The most tokens a request may reach (at most max_model_len) with the pool to itself, prompt chunks
    of up to max_num_batched_tokens included."""
    return config.kv_layout.longest_request(
        num_blocks, config.kv_block_size, config.kv_lookback, config.token_budget, config.context_len
    )
