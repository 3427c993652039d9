"""Block bookkeeping, asserted exactly (block ids and free-queue order), as vLLM's tests do."""

from __future__ import annotations

import pytest

from suffixmem.engine.torch.block_pool import (
    BlockHash,
    BlockPool,
    FreeBlockQueue,
    Match,
    hash_block,
)
from suffixmem.errors import CapacityError

BS = 4


def prompt(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def cache_all(pool: BlockPool, block_ids: list[int], tokens: list[int], salt: str) -> None:
    """Register every full block of ``tokens`` held in ``block_ids`` (what the engine does)."""
    parent: BlockHash | None = None
    for i in range(len(tokens) // pool.block_size):
        chunk = tokens[i * pool.block_size:(i + 1) * pool.block_size]
        parent = pool.cache_block(block_ids[i], parent, chunk, salt)


def test_free_queue_is_a_doubly_linked_list() -> None:
    pool = BlockPool(5, BS)
    q = pool.free_queue
    assert isinstance(q, FreeBlockQueue)
    assert q.block_ids() == [0, 1, 2, 3, 4]
    q.remove(pool.blocks[2])  # from the middle, O(1)
    assert q.block_ids() == [0, 1, 3, 4]
    assert q.popleft().block_id == 0
    q.append(pool.blocks[2])
    assert q.block_ids() == [1, 3, 4, 2]
    assert q.num_free == 4
    with pytest.raises(ValueError):
        q.remove(pool.blocks[0])  # not in the queue


def test_allocate_free_order_tail_first() -> None:
    pool = BlockPool(10, BS)
    a = pool.allocate(3)
    b = pool.allocate(2)
    assert a == [0, 1, 2]
    assert b == [3, 4]
    assert pool.num_free == 5
    assert pool.free_block_ids() == [5, 6, 7, 8, 9]
    pool.decref(a)  # released tail-first: 2, 1, 0
    assert pool.free_block_ids() == [5, 6, 7, 8, 9, 2, 1, 0]
    pool.decref(b)
    assert pool.free_block_ids() == [5, 6, 7, 8, 9, 2, 1, 0, 4, 3]
    # LRU: the next allocations take the least recently freed blocks first
    assert pool.allocate(6) == [5, 6, 7, 8, 9, 2]
    assert pool.free_block_ids() == [1, 0, 4, 3]


def test_capacity_error_and_can_allocate() -> None:
    pool = BlockPool(3, BS)
    assert pool.can_allocate(3)
    assert not pool.can_allocate(4)
    held = pool.allocate(2)
    assert not pool.can_allocate(2)
    with pytest.raises(CapacityError, match="1 free of 3"):
        pool.allocate(2)
    assert pool.num_free == 1  # a failed allocate changes nothing
    pool.decref(held)
    assert pool.can_allocate(3)
    with pytest.raises(ValueError, match="reference count is 0"):
        pool.decref([held[0]])


def test_prefix_hit_revives_free_cached_blocks() -> None:
    pool = BlockPool(10, BS)
    tokens = prompt(10)  # 2 full blocks + 2 tokens
    blocks = pool.allocate(3)
    cache_all(pool, blocks, tokens, "s")
    assert pool.num_cached_blocks == 2
    assert pool.is_cached(0) and pool.is_cached(1) and not pool.is_cached(2)
    pool.decref(blocks)
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]

    m = pool.match([*tokens, 7, 7, 7], "s")
    assert m == Match((0, 1), 8, m.block_hashes, 8)
    assert m.block_hashes == tuple(pool.block_hashes(tokens, "s"))
    # reviving takes the blocks out of the free queue, hashes kept
    assert pool.can_allocate(8, reuse=m.block_ids)
    assert not pool.can_allocate(9, reuse=m.block_ids)
    pool.incref(m.block_ids)
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2]
    assert pool.ref_count(0) == 1 and pool.is_cached(0)
    # a second holder (the segment cache) keeps them alive after the sequence is done
    pool.incref([1])
    pool.decref(list(m.block_ids))
    assert pool.ref_count(1) == 1
    assert pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 0]


def test_match_caps_and_partial_blocks() -> None:
    pool = BlockPool(10, BS)
    tokens = prompt(12)
    blocks = pool.allocate(3)
    cache_all(pool, blocks, tokens, "s")
    assert pool.match(tokens, "s").num_cached_tokens == 12
    # the engine keeps the last prompt token to compute: a cap drops the last full block
    assert pool.match(tokens, "s", max_tokens=11).block_ids == (0, 1)
    assert pool.match(tokens[:7], "s").block_ids == (0,)
    # a divergence in block 1 stops the walk there, even if block 2's tokens are equal
    other = [*tokens[:5], 0, *tokens[6:]]
    assert pool.match(other, "s").block_ids == (0,)
    assert pool.match([], "s") == Match((), 0)


def test_session_isolation() -> None:
    pool = BlockPool(10, BS)
    tokens = prompt(8)
    blocks = pool.allocate(2)
    cache_all(pool, blocks, tokens, "alice")
    assert pool.match(tokens, "alice").num_cached_tokens == 8
    assert pool.match(tokens, "bob").num_cached_tokens == 0
    # bob computes the same tokens into his own blocks: both copies are cached side by side
    bob = pool.allocate(2)
    cache_all(pool, bob, tokens, "bob")
    assert pool.match(tokens, "bob").block_ids == tuple(bob)
    assert pool.match(tokens, "alice").block_ids == tuple(blocks)
    assert pool.block_hashes(tokens, "alice") != pool.block_hashes(tokens, "bob")


def test_forget_drops_a_deleted_sessions_blocks_in_use_or_free() -> None:
    """``forget`` (a deleted session): none of its blocks is found again, also one still held
    (the segment cache holds blocks); other salts keep theirs; a held block returns to the
    free queue uncached."""
    pool = BlockPool(10, BS)
    tokens = prompt(12)
    alice = pool.allocate(3)
    cache_all(pool, alice, tokens, "alice")
    bob = pool.allocate(3)
    cache_all(pool, bob, tokens, "bob")
    pool.decref(alice[:2])  # blocks 0-1 free (still cached); block 2 still held
    assert pool.forget(["alice", "alice\x00approx"]) == 3
    assert pool.match(tokens, "alice").num_cached_tokens == 0
    assert pool.match(tokens, "bob").block_ids == tuple(bob)
    pool.decref(alice[2:])
    assert pool.free_queue.num_free == 10 - 3  # bob's three are still held
    assert all(pool.blocks[b].block_hash is None for b in alice)


def test_hash_collision_is_rechecked() -> None:
    def weak_hash(parent: BlockHash | None, tokens: tuple[int, ...], salt: str) -> BlockHash:
        return BlockHash(bytes([sum(tokens) % 7]))  # collides all the time; ignores the salt

    pool = BlockPool(6, BS, hash_fn=weak_hash)
    a = [1, 2, 3, 4]
    b = [4, 3, 2, 1]  # same sum: same hash, different tokens
    blocks = pool.allocate(1)
    cache_all(pool, blocks, a, "s")
    assert weak_hash(None, tuple(b), "s") == weak_hash(None, tuple(a), "s")
    assert pool.match(b, "s").num_cached_tokens == 0
    assert pool.match(a, "t").num_cached_tokens == 0  # the salt is re-checked too
    assert pool.match(a, "s").block_ids == (0,)
    # same hash and tokens, but cached after another parent: the parent is re-checked too
    blocks2 = pool.allocate(1)
    pool.cache_block(blocks2[0], BlockHash(b"elsewhere"), [9, 9, 9, 9], "s")
    assert pool.match([*a, 9, 9, 9, 9], "s").block_ids == (0,)


def test_eviction_under_pressure_spares_blocks_in_use() -> None:
    pool = BlockPool(6, BS)
    s1, s2 = prompt(8, 0), prompt(8, 50)
    b1 = pool.allocate(2)
    cache_all(pool, b1, s1, "s")
    b2 = pool.allocate(2)
    cache_all(pool, b2, s2, "s")
    pool.decref(b1)  # s1 is finished: its blocks are free but still cached
    assert pool.free_block_ids() == [4, 5, 1, 0]
    # a new request needs 3 blocks: the 2 never-used ones, then s1's newest block
    new = pool.allocate(3)
    assert new == [4, 5, 1]
    assert pool.num_evicted == 1
    assert pool.match(s1, "s").block_ids == (0,)  # the older block survives
    assert pool.match(s2, "s").block_ids == (2, 3)  # in use: never evicted
    with pytest.raises(CapacityError):
        pool.allocate(2)
    assert pool.match(s2, "s").block_ids == (2, 3)
    pool.decref(new)
    pool.decref(b2)
    assert pool.free_block_ids() == [0, 1, 5, 4, 3, 2]


def test_cache_block_keeps_the_first_copy_and_reset() -> None:
    pool = BlockPool(4, BS)
    tokens = prompt(4)
    first, second = pool.allocate(2)
    h = pool.cache_block(first, None, tokens, "s")
    assert pool.cache_block(second, None, tokens, "s") == h
    assert not pool.is_cached(second)  # a duplicate stays a plain block
    assert pool.cache_block(first, None, tokens, "s") == h  # idempotent
    with pytest.raises(ValueError, match="full blocks"):
        pool.cache_block(second, None, tokens[:3], "s")
    pool.decref([first, second])
    assert pool.reset() == 1
    assert pool.match(tokens, "s").num_cached_tokens == 0


def test_approximate_blocks_need_their_own_salt() -> None:
    pool = BlockPool(6, BS)
    tokens = prompt(12)
    blocks = pool.allocate(3)
    parent = pool.cache_block(blocks[0], None, tokens[:4], "s")  # exact
    parent = pool.cache_block(blocks[1], parent, tokens[4:8], "s~")  # approximate from here
    pool.cache_block(blocks[2], parent, tokens[8:12], "s~")
    assert pool.match(tokens, "s").block_ids == (blocks[0],)  # exact requests stop there
    m = pool.match(tokens, "s", approx_salt="s~")
    assert m.block_ids == tuple(blocks)
    assert (m.num_cached_tokens, m.num_exact_tokens) == (12, 4)


def test_default_hash_chains_parent_tokens_and_salt() -> None:
    t = (1, 2, 3, 4)
    h = hash_block(None, t, "s")
    assert len(h) == 16
    assert hash_block(None, t, "s") == h
    assert hash_block(h, t, "s") != h
    assert hash_block(None, t, "x") != h
    assert hash_block(None, (1, 2, 3, 5), "s") != h
    # salt and token bytes cannot be confused
    assert hash_block(None, (), "s" + "\x00" * 8) != hash_block(None, (0,), "s")
