"""KVCacheManager with one cache group: paged KV blocks, hash-chained prefix cache of confirmed tokens, free
FIFO with revival, decode-time appends (tests/core/test_cache_groups.py covers several groups)."""

import pytest

import nanovllm.core.kv_cache_manager as manager_module
from nanovllm.core.kv_cache_manager import KVCacheManager, chain_hash
from nanovllm.core.request import Request
from nanovllm.sampling_params import SamplingParams

from helpers.schedulers import FULL_ATTENTION, block_hash, held_blocks

BS = 4


def BlockManager(num_blocks, block_size, enable_prefix_caching=True):
    """A manager of one full-attention group."""
    return KVCacheManager(FULL_ATTENTION, num_blocks, block_size, enable_prefix_caching)


def make_req(token_ids):
    return Request("r", list(token_ids), SamplingParams(), BS)


def table(req):
    return req.block_tables[0]


def hits_of(bm, req):
    return bm.cached_prefix(req).tables[0]


def admit(bm, req):
    hit = bm.cached_prefix(req)
    assert bm.can_allocate(req, hit, req.num_tokens)
    bm.allocate(req, hit, req.num_tokens)
    return hit.tables[0]


def decode_step(bm, req, token):
    """Compute `req`'s last token and append `token` after it, known at once (no step in flight)."""
    req.num_computed_tokens = req.num_tokens
    req.add_placeholder()
    req.confirm(token)
    ok = bm.can_append(req, req.num_tokens)
    if ok:
        bm.may_append(req, req.num_tokens)
    return ok


def assert_writes_go_to_private_blocks(bm, req):
    """Every block receiving K/V this step (positions num_computed..num_tokens-1) is owned by `req` alone."""
    first, last = req.num_computed_tokens // BS, (req.num_tokens - 1) // BS
    for i in range(first, last + 1):
        assert bm.blocks[table(req)[i]].ref_count == 1


P0, P1, P2 = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]


def test_chain_hash_depends_on_every_earlier_block():
    h0 = chain_hash(P0)
    assert chain_hash(P1, h0) == chain_hash(P1, chain_hash(P0))
    assert chain_hash(P1, h0) != chain_hash(P1, chain_hash(P2))
    assert chain_hash(P1, h0) != chain_hash(P1)
    assert chain_hash(P2, chain_hash(P1, h0)) != chain_hash(P2, chain_hash(P1, chain_hash([1, 2, 3, 5])))


def test_full_blocks_are_registered_with_chained_hashes():
    bm = BlockManager(8, BS)
    req = make_req(P0 + P1 + [42])
    admit(bm, req)
    b0, b1, b2 = (bm.blocks[i] for i in table(req))
    assert block_hash(bm, b0.block_id) == chain_hash(P0) and b0.token_ids == P0
    assert block_hash(bm, b1.block_id) == chain_hash(P1, chain_hash(P0)) and b1.token_ids == P1
    assert block_hash(bm, b2.block_id) == -1
    assert bm.cached_blocks[0, block_hash(bm, b0.block_id)] == b0.block_id
    assert bm.cached_blocks[0, block_hash(bm, b1.block_id)] == b1.block_id


def test_without_prefix_caching_nothing_is_registered_or_shared():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = make_req(P0 + P1 + [42])
    admit(bm, a)
    assert all(block_hash(bm, i) == -1 for i in table(a)) and bm.cached_blocks == {}
    assert all(decode_step(bm, a, t) for t in (43, 44, 45))  # the third block fills: still nothing registered
    assert bm.cached_blocks == {}
    b = make_req(P0 + P1 + [50])
    assert admit(bm, b) == [] and b.num_cached_tokens == 0
    assert not set(table(a)) & set(table(b))


def test_same_block_after_different_prefix_is_a_miss():
    bm = BlockManager(8, BS)
    a = make_req(P0 + P1 + [42])
    admit(bm, a)
    b = make_req(P2 + P1 + [42])
    assert admit(bm, b) == []
    assert b.num_cached_tokens == 0
    assert not set(table(a)) & set(table(b))


def test_prefix_hit_shares_blocks_and_counts_cached_tokens():
    bm = BlockManager(8, BS)
    a = make_req(P0 + P1 + [42, 43])
    admit(bm, a)
    b = make_req(P0 + P1 + [50, 51, 52])
    hits = admit(bm, b)
    assert hits == table(a)[:2]
    assert table(b)[:2] == table(a)[:2] and table(b)[2] != table(a)[2]
    assert [bm.blocks[i].ref_count for i in table(b)] == [2, 2, 1]
    assert b.num_cached_tokens == b.num_computed_tokens == 8
    assert bm.num_free_blocks == 8 - 4


def test_partial_prefix_hit_stops_at_first_differing_block():
    bm = BlockManager(8, BS)
    admit(bm, make_req(P0 + P1 + P2 + [42]))
    b = make_req(P0 + [9, 9, 9, 9] + P2 + [42])
    assert len(admit(bm, b)) == 1
    assert b.num_cached_tokens == 4


def test_blocks_after_first_miss_are_misses_even_if_registered():
    bm = BlockManager(8, BS)
    a = make_req(P0 + P1 + [42])
    admit(bm, a)
    # Lose the mapping of the first block only (as if it had been evicted);
    # the second block stays registered with matching hash and tokens.
    del bm.cached_blocks[0, chain_hash(P0)]
    h1 = chain_hash(P1, chain_hash(P0))
    assert bm.blocks[bm.cached_blocks[0, h1]].token_ids == P1
    b = make_req(P0 + P1 + [42])
    assert hits_of(bm, b) == []
    admit(bm, b)
    assert b.num_cached_tokens == 0
    assert not set(table(a)) & set(table(b))


def test_hash_collision_with_different_tokens_is_a_miss(monkeypatch):
    monkeypatch.setattr(manager_module, "chain_hash", lambda token_ids, prefix_hash=-1: 1234)
    bm = BlockManager(8, BS)
    a = make_req(P0 + [42])
    admit(bm, a)
    assert bm.cached_blocks[0, 1234] == table(a)[0]
    b = make_req(P1 + [42])
    assert hits_of(bm, b) == []
    admit(bm, b)
    assert b.num_cached_tokens == 0
    assert bm.blocks[table(a)[0]].ref_count == 1
    assert table(b)[0] != table(a)[0]


def test_tampered_block_tokens_are_a_miss():
    bm = BlockManager(8, BS)
    a = make_req(P0 + [42])
    admit(bm, a)
    bm.blocks[table(a)[0]].token_ids = [0, 0, 0, 0]
    assert hits_of(bm, make_req(P0 + [42])) == []


def test_prompt_of_exact_full_blocks_leaves_last_block_uncached():
    bm = BlockManager(8, BS)
    a = make_req(P0 + P1 + P2)
    admit(bm, a)
    b = make_req(P0 + P1 + P2)
    assert admit(bm, b) == table(a)[:2]
    assert b.num_cached_tokens == 8 and b.num_new_tokens == 4
    assert table(b)[2] != table(a)[2]
    assert bm.blocks[table(b)[2]].ref_count == 1


def test_single_full_block_prompt_gets_no_hit():
    bm = BlockManager(4, BS)
    admit(bm, make_req(P0))
    b = make_req(P0)
    assert admit(bm, b) == [] and b.num_computed_tokens == 0


def test_deallocate_frees_in_reverse_order_to_fifo_tail_keeping_hashes():
    bm = BlockManager(6, BS)
    req = make_req(P0 + P1 + [42])
    admit(bm, req)
    assert table(req) == [0, 1, 2]
    hashes = [block_hash(bm, i) for i in range(3)]
    bm.deallocate(req)
    assert list(bm.free_block_ids) == [3, 4, 5, 2, 1, 0]
    assert held_blocks(bm) == set()
    assert [bm.blocks[i].ref_count for i in range(3)] == [0, 0, 0]
    assert [block_hash(bm, i) for i in range(3)] == hashes
    assert bm.cached_blocks[0, hashes[1]] == 1
    assert req.block_tables == [] and req.num_computed_tokens == 0


def test_deallocate_of_one_sharer_keeps_shared_blocks_in_use():
    bm = BlockManager(8, BS)
    a, b = make_req(P0 + P1 + [42]), make_req(P0 + P1 + [43])
    admit(bm, a)
    admit(bm, b)
    shared, a_tail = table(a)[:2], table(a)[2]
    bm.deallocate(a)
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1]
    assert set(shared) <= held_blocks(bm)
    assert list(bm.free_block_ids)[-1] == a_tail
    assert bm.num_free_blocks == 8 - 3
    bm.deallocate(b)
    assert bm.num_free_blocks == 8 and list(bm.free_block_ids)[-2:] == shared[::-1]


def test_freed_block_is_revived_by_identical_prefix():
    bm = BlockManager(6, BS)
    a = make_req(P0 + P1 + [42])
    admit(bm, a)
    old = list(table(a))
    bm.deallocate(a)
    b = make_req(P0 + P1 + [77, 78])
    assert admit(bm, b) == old[:2]
    assert table(b)[:2] == old[:2]
    assert b.num_cached_tokens == 8
    assert [bm.blocks[i].ref_count for i in old[:2]] == [1, 1]
    assert set(old[:2]) <= held_blocks(bm)
    assert not set(old[:2]) & set(bm.free_block_ids)
    assert bm.num_free_blocks == 6 - 3


def test_freed_block_reused_for_new_content_loses_old_hash():
    bm = BlockManager(3, BS)
    a = make_req(P0 + [42])
    admit(bm, a)
    bm.deallocate(a)
    assert list(bm.free_block_ids) == [2, 1, 0]
    c = make_req(P2 + P1 + [7, 7, 7, 7])
    admit(bm, c)
    assert sorted(table(c)) == [0, 1, 2]
    assert (0, chain_hash(P0)) not in bm.cached_blocks
    assert bm.blocks[0].token_ids != P0
    bm.deallocate(c)
    d = make_req(P0 + [42])
    assert admit(bm, d) == [] and d.num_cached_tokens == 0


def test_can_allocate_does_not_charge_for_in_use_hits():
    bm = BlockManager(5, BS)
    admit(bm, make_req(P0 + P1 + [42]))
    b = make_req(P0 + P1 + P2)
    admit(bm, make_req([100]))
    assert bm.num_free_blocks == 1
    hit = bm.cached_prefix(b)
    assert len(hit.tables[0]) == 2 and bm.can_allocate(b, hit, b.num_tokens)
    admit(bm, make_req([101]))
    assert bm.num_free_blocks == 0 and not bm.can_allocate(b, hit, b.num_tokens)


def pool_with_two_freed_cached_blocks():
    """A 5-block pool with P0 and P1 cached in freed blocks and two blocks held by others; b wants P0 P1 P2."""
    bm = BlockManager(5, BS)
    a = make_req(P0 + P1 + [42])
    admit(bm, a)
    bm.deallocate(a)
    admit(bm, make_req([100]))
    admit(bm, make_req([101]))
    return bm, make_req(P0 + P1 + P2)


def test_can_allocate_charges_for_revived_free_hits():
    bm, b = pool_with_two_freed_cached_blocks()
    hit = bm.cached_prefix(b)
    assert len(hit.tables[0]) == 2 and bm.num_free_blocks == 3
    assert bm.can_allocate(b, hit, b.num_tokens)
    admit(bm, make_req([102]))
    hit = bm.cached_prefix(b)
    assert len(hit.tables[0]) == 2 and bm.num_free_blocks == 2
    assert not bm.can_allocate(b, hit, b.num_tokens)


def test_allocate_takes_exactly_the_blocks_can_allocate_counted():
    bm, b = pool_with_two_freed_cached_blocks()
    admit(bm, b)
    assert bm.num_free_blocks == 0
    assert len(set(table(b))) == 3
    assert len(held_blocks(bm)) == 5


def test_can_append_needs_a_block_only_after_crossing_a_boundary():
    bm = BlockManager(1, BS)
    req = make_req([1, 2, 3])
    admit(bm, req)
    assert bm.num_free_blocks == 0
    assert decode_step(bm, req, 4)
    assert table(req) == [0]
    req.num_computed_tokens = req.num_tokens
    req.add_placeholder()
    assert req.num_tokens == 5 and not bm.can_append(req, req.num_tokens)


def test_may_append_takes_a_block_at_the_boundary_only():
    bm = BlockManager(3, BS)
    req = make_req(P0)
    admit(bm, req)
    assert decode_step(bm, req, 50)
    assert len(table(req)) == 2 and bm.num_free_blocks == 1
    new_block = bm.blocks[table(req)[1]]
    assert new_block.ref_count == 1 and block_hash(bm, new_block.block_id) == -1
    for t in (51, 52):
        assert decode_step(bm, req, t)
        assert len(table(req)) == 2 and bm.num_free_blocks == 1


def test_block_filled_during_decode_is_registered_with_chained_hash():
    bm = BlockManager(4, BS)
    req = make_req(P0 + [50])
    admit(bm, req)
    for t in (51, 52, 53):
        assert decode_step(bm, req, t)
    filled = bm.blocks[table(req)[1]]
    expected = chain_hash([50, 51, 52, 53], chain_hash(P0))
    assert block_hash(bm, filled.block_id) == expected and filled.token_ids == [50, 51, 52, 53]
    assert bm.cached_blocks[0, expected] == filled.block_id
    follower = make_req(P0 + [50, 51, 52, 53, 9])
    assert hits_of(bm, follower) == table(req)[:2]


def test_block_filled_during_decode_after_unhashed_prompt_chains_whole_prefix():
    bm = BlockManager(4, BS)
    req = make_req([1, 2])
    admit(bm, req)
    for t in (3, 4, 5, 6, 7, 8):
        assert decode_step(bm, req, t)
    assert block_hash(bm, table(req)[0]) == chain_hash([1, 2, 3, 4])
    assert block_hash(bm, table(req)[1]) == chain_hash([5, 6, 7, 8], chain_hash([1, 2, 3, 4]))


def test_may_append_registers_only_blocks_full_of_confirmed_tokens():
    bm = BlockManager(4, BS)
    req = make_req(P0 + [5, 6, 7])
    admit(bm, req)
    req.add_placeholder()
    bm.may_append(req, 8)
    block = bm.blocks[table(req)[1]]
    assert block_hash(bm, block.block_id) == -1
    req.add_placeholder()
    bm.may_append(req, 9)
    assert len(table(req)) == 3 and block_hash(bm, block.block_id) == -1
    req.confirm(8)
    bm.may_append(req, 9)
    expected = chain_hash([5, 6, 7, 8], chain_hash(P0))
    assert block_hash(bm, block.block_id) == expected and block.token_ids == [5, 6, 7, 8]
    assert bm.cached_blocks[0, expected] == block.block_id
    assert block_hash(bm, table(req)[2]) == -1


@pytest.mark.parametrize("prompt_len", [3, 4, 5, 8, 9, 12])
def test_never_writes_into_a_shared_block(prompt_len):
    bm = BlockManager(16, BS)
    prompt = list(range(1, prompt_len + 1))
    a, b = make_req(prompt), make_req(prompt)
    for req in (a, b):
        admit(bm, req)
        assert_writes_go_to_private_blocks(bm, req)
    for step in range(6):
        for req in (a, b):
            assert decode_step(bm, req, 100 + step)
            assert_writes_go_to_private_blocks(bm, req)
            if req.num_tokens % BS:
                assert bm.blocks[table(req)[-1]].ref_count == 1
