"""One budget for KV blocks and recurrent-state slots: split by what a sequence at max_model_len needs (P blocks,
two slots), the slots capped at 3 * max_num_seqs and never fewer than 2, the blocks as given where set; a model
without recurrent layers gets the blocks alone, as before."""

from types import SimpleNamespace

import pytest
import torch

from nanovllm.cache.layout import cache_layout
from nanovllm.cache.specs import FullAttention, RecurrentState
from nanovllm.worker import kv_cache_sizing
from nanovllm.worker.kv_cache_sizing import cache_capacity, kv_capacity

MIB = 1 << 20
BLOCK_BYTES, SLOT_BYTES = 1024, 2048
CPU = torch.device("cpu")


def config(context_len: int = 64, max_num_seqs: int = 100, num_kvcache_blocks: int = -1, state: bool = True):
    """A stand-in config with a 1 MiB budget: two attention layers in one group of blocks of 4 tokens, so a
    sequence at `context_len` holds context_len / 4 blocks, and (with `state`) a recurrent layer."""
    specs = [FullAttention(1, 8)] * 2 + ([RecurrentState(((4,),), (None,))] if state else [])
    return SimpleNamespace(
        num_kvcache_blocks=num_kvcache_blocks,
        cpu_kvcache_gb=1 / 1024,
        max_num_seqs=max_num_seqs,
        kv_layout=cache_layout(specs),
        context_len=context_len,
        kv_block_size=4,
        kv_lookback=0,
    )


def test_the_budget_is_split_by_what_a_sequence_needs():
    # a sequence of 64 tokens holds 16 blocks of 1 KiB and two slots of 2 KiB: the slots get 4/20 of the budget
    capacity = cache_capacity(config(), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert capacity.num_state_slots == 2 * MIB // (16 * BLOCK_BYTES + 2 * SLOT_BYTES) == 102
    assert capacity.num_blocks == (MIB - 102 * SLOT_BYTES) // BLOCK_BYTES == 820
    assert abs(capacity.num_state_slots * SLOT_BYTES / MIB - 0.2) < 0.002


def test_slots_are_capped_at_three_per_sequence_and_blocks_at_what_the_sequences_use():
    capacity = cache_capacity(config(max_num_seqs=10), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert (capacity.num_state_slots, capacity.num_blocks) == (30, 10 * 16)


def test_at_least_two_slots_where_the_share_gives_fewer():
    # a 1024-token sequence holds 256 blocks: 400 KiB slots would get one slot by their share
    slot_bytes = 400 << 10
    assert 2 * MIB // (256 * BLOCK_BYTES + 2 * slot_bytes) == 1
    capacity = cache_capacity(config(context_len=1024), BLOCK_BYTES, slot_bytes, CPU, 1)
    assert (capacity.num_state_slots, capacity.num_blocks) == (2, (MIB - 2 * slot_bytes) // BLOCK_BYTES)


@pytest.mark.parametrize("slot_bytes", [600 << 10, MIB // 2])  # two slots do not fit; they fit but no block does
def test_a_budget_without_room_for_two_slots_and_a_block_is_refused(slot_bytes):
    with pytest.raises(ValueError, match=r"no room for the caches: 0.001 GiB \(cpu_kvcache_gb=.*\) must hold 2"):
        cache_capacity(config(), BLOCK_BYTES, slot_bytes, CPU, 1)


def test_blocks_set_by_the_user_leave_the_rest_to_the_slots():
    capacity = cache_capacity(config(num_kvcache_blocks=900), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert (capacity.num_blocks, capacity.num_state_slots) == (900, (MIB - 900 * BLOCK_BYTES) // SLOT_BYTES)
    capacity = cache_capacity(config(num_kvcache_blocks=100, max_num_seqs=10), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert (capacity.num_blocks, capacity.num_state_slots) == (100, 30)
    with pytest.raises(ValueError, match="no room for the caches"):
        cache_capacity(config(num_kvcache_blocks=1023), BLOCK_BYTES, SLOT_BYTES, CPU, 1)


def test_the_cpu_cache_with_its_slots_must_fit_in_memory(monkeypatch):
    # 820 blocks and 102 slots take the whole MiB, more than 90% of 1 MiB
    monkeypatch.setattr(kv_cache_sizing, "available_memory_bytes", lambda: MIB)
    with pytest.raises(ValueError, match="does not fit in memory"):
        cache_capacity(config(), BLOCK_BYTES, SLOT_BYTES, CPU, 1)


def test_a_model_without_state_gets_the_blocks_it_got_before_and_no_slot():
    stateless = config(state=False)
    capacity = cache_capacity(stateless, BLOCK_BYTES, 0, CPU, 1)
    assert capacity.num_state_slots == 0
    assert capacity.num_blocks == kv_capacity(stateless, BLOCK_BYTES, CPU, 1) == MIB // BLOCK_BYTES
