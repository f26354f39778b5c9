"""Paged KV-cache bookkeeping with a hash-chained prefix cache."""

from array import array
from collections import deque

import xxhash

from nanovllm.core.request import Request


class Block:
    """One physical block of the KV cache."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def set_content(self, block_hash: int, token_ids: list[int]) -> None:
        self.hash = block_hash
        self.token_ids = list(token_ids)

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


def chain_hash(token_ids: list[int], prefix_hash: int = -1) -> int:
    """xxhash64 of the previous block's hash and this block's tokens: names the whole prefix."""
    h = xxhash.xxh64()
    if prefix_hash != -1:
        h.update(prefix_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


class BlockManager:
    """Owns the pool of KV blocks: hands them out, shares cached prefixes, frees them.

    Free blocks wait in a FIFO and keep their hash, so a later request with the
    same prefix can revive them; a block is only reused for new content once it
    reaches the head of the queue. With `enable_prefix_caching=False` no block
    is looked up or registered: every request computes all its tokens.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def cached_prefix(self, req: Request) -> list[int]:
        """Block ids that already hold the leading full blocks of `req`.

        At least one token is always left to compute, so that the step has a
        last position to sample from and never writes into a shared block.
        None are found with prefix caching off.
        """
        hits = []
        if not self.enable_prefix_caching:
            return hits
        prefix_hash = -1
        for i in range(req.num_blocks):
            if (i + 1) * self.block_size >= req.num_tokens:
                break
            tokens = req.block(i)
            prefix_hash = chain_hash(tokens, prefix_hash)
            block_id = self.hash_to_block_id.get(prefix_hash, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, req: Request, hits: list[int]) -> bool:
        """Whether the free list covers `req`'s blocks, given its prefix-cache hits."""
        shared_in_use = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.num_free_blocks >= req.num_blocks - shared_in_use

    def allocate(self, req: Request, hits: list[int], num_computed: int | None = None) -> None:
        """Give `req` a block table for all its tokens: `hits` shared, the rest fresh.

        `num_computed` is how many tokens will have K/V once this step ran (all
        of them unless the prompt is chunked); the full blocks among them are
        registered in the prefix cache, and no others, so that a later request
        never shares a block whose K/V is not computed yet.
        """
        assert not req.block_table
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                self.free_block_ids.remove(block_id)
                self.used_block_ids.add(block_id)
            block.ref_count += 1
            req.block_table.append(block_id)
        req.num_cached_tokens = req.num_computed_tokens = len(hits) * self.block_size
        self.may_append(req, num_computed)

    def deallocate(self, req: Request) -> None:
        """Drop `req`'s references, last block first; freed blocks keep their hash."""
        for block_id in reversed(req.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        req.block_table.clear()
        req.num_computed_tokens = 0

    def can_append(self, req: Request) -> bool:
        """Whether the free list covers the blocks `req` needs for its new tokens."""
        return req.num_blocks - len(req.block_table) <= len(self.free_block_ids)

    def may_append(self, req: Request, num_computed: int | None = None) -> None:
        """Take the blocks `req`'s new tokens need and register the blocks that
        are full once its first `num_computed` tokens (default all) have K/V.

        Only confirmed tokens count: a block holding a placeholder is registered
        by a later step, once its value is known. Nothing is registered with
        prefix caching off.
        """
        table = req.block_table
        for _ in range(req.num_blocks - len(table)):
            table.append(self._take_free_block())
        if not self.enable_prefix_caching:
            return
        num_known = len(req.token_ids) if num_computed is None else min(num_computed, len(req.token_ids))
        num_full = num_known // self.block_size
        # Most decode steps fill no block; then the last full one already has its hash.
        if num_full and self.blocks[table[num_full - 1]].hash == -1:
            self._register_full_blocks(req, num_full)

    def _register_full_blocks(self, req: Request, num_full: int) -> None:
        # Walk back to the last block that already has a hash, then chain forward.
        first = num_full
        while first > 0 and self.blocks[req.block_table[first - 1]].hash == -1:
            first -= 1
        prefix_hash = self.blocks[req.block_table[first - 1]].hash if first > 0 else -1
        for i in range(first, num_full):
            tokens = req.block(i)
            prefix_hash = chain_hash(tokens, prefix_hash)
            block = self.blocks[req.block_table[i]]
            block.set_content(prefix_hash, tokens)
            self.hash_to_block_id[prefix_hash] = block.block_id

    def _take_free_block(self) -> int:
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        if self.hash_to_block_id.get(block.hash) == block_id:
            del self.hash_to_block_id[block.hash]
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id
