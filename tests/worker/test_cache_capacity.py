"""One budget for KV blocks and recurrent-state slots: split by what a sequence at max_model_len needs (P blocks,
two slots), the slots capped at 3 * max_num_seqs and never fewer than 2, the blocks as given where set; a budget
sized from memory that cannot hold the states of max_num_seqs running sequences is refused saying how many fit;
a model without recurrent layers gets the blocks alone, as before."""

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
    # a 1024-token sequence holds 256 blocks: 400 KiB slots would get one slot by their share; the one
    # sequence max_num_seqs allows has its two beside a block
    slot_bytes = 400 << 10
    assert 2 * MIB // (256 * BLOCK_BYTES + 2 * slot_bytes) == 1
    capacity = cache_capacity(config(context_len=1024, max_num_seqs=1), BLOCK_BYTES, slot_bytes, CPU, 1)
    assert (capacity.num_state_slots, capacity.num_blocks) == (2, (MIB - 2 * slot_bytes) // BLOCK_BYTES)


@pytest.mark.parametrize("slot_bytes", [600 << 10, MIB // 2])  # two slots do not fit; they fit but no block does
def test_a_budget_without_room_for_two_slots_and_a_block_is_refused(slot_bytes):
    with pytest.raises(ValueError, match=r"no room for the caches: 0.001 GiB \(cpu_kvcache_gb=.*\) must hold 2"):
        cache_capacity(config(), BLOCK_BYTES, slot_bytes, CPU, 1)


# 64 KiB slots: a sequence's state takes 128 KiB, and with its KV at 1024 tokens (256 blocks) 384 KiB
BIG_SLOT_BYTES = 64 << 10


def test_max_num_seqs_whose_states_do_not_fit_is_refused_saying_how_many_do():
    # (1 MiB - one block) // 128 KiB = 7 sequences' states; 1 MiB // 384 KiB = 2 with their KV at 1024 tokens
    message = (
        r"max_num_seqs=8 is more sequences than the caches can run: the state of one sequence takes 0.000122 GiB "
        r"\(2 recurrent-state slots: its live state and its snapshot\); the budget of 0.000977 GiB "
        r"\(cpu_kvcache_gb=0.0009765625\) holds 7 sequences' states beside one KV block, and 2 sequences' states "
        r"with their KV at context_len 1024 tokens \(0.000244 GiB each\); lower max_num_seqs to at most 7, or raise "
        r"cpu_kvcache_gb$"
    )
    with pytest.raises(ValueError, match=message):
        cache_capacity(config(context_len=1024, max_num_seqs=8), BLOCK_BYTES, BIG_SLOT_BYTES, CPU, 1)


def test_max_num_seqs_whose_states_fit_but_not_their_kv_runs_fewer_at_max_model_len():
    # seven sequences' states fit: the split gives the slots their share, five, so two run at 1024 tokens
    capacity = cache_capacity(config(context_len=1024, max_num_seqs=7), BLOCK_BYTES, BIG_SLOT_BYTES, CPU, 1)
    assert capacity.num_state_slots == 2 * MIB // (256 * BLOCK_BYTES + 2 * BIG_SLOT_BYTES) == 5
    assert capacity.num_blocks == (MIB - 5 * BIG_SLOT_BYTES) // BLOCK_BYTES


@pytest.mark.parametrize("other_rank_has_less", [False, True])
def test_the_sequences_whose_states_fit_are_the_least_over_the_ranks(monkeypatch, other_rank_has_less):
    # another rank whose budget holds one block, one slot and one sequence's states fewer: seven are refused
    monkeypatch.setattr(kv_cache_sizing, "all_ranks_min", lambda value, device: value - other_rank_has_less)
    seven = config(context_len=1024, max_num_seqs=7)
    if other_rank_has_less:
        with pytest.raises(ValueError, match=r"holds 6 sequences' states .* lower max_num_seqs to at most 6, or"):
            cache_capacity(seven, BLOCK_BYTES, BIG_SLOT_BYTES, CPU, 2)
    else:
        assert cache_capacity(seven, BLOCK_BYTES, BIG_SLOT_BYTES, CPU, 2).num_state_slots == 5


def test_blocks_set_by_the_user_leave_the_rest_to_the_slots():
    capacity = cache_capacity(config(num_kvcache_blocks=900), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert (capacity.num_blocks, capacity.num_state_slots) == (900, (MIB - 900 * BLOCK_BYTES) // SLOT_BYTES)
    capacity = cache_capacity(config(num_kvcache_blocks=100, max_num_seqs=10), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert (capacity.num_blocks, capacity.num_state_slots) == (100, 30)
    # blocks set by the user leave the slots of a few running sequences, who run fewer: no refusal
    capacity = cache_capacity(config(num_kvcache_blocks=1000), BLOCK_BYTES, SLOT_BYTES, CPU, 1)
    assert capacity.num_state_slots == 12
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
