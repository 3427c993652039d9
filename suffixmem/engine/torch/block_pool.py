"""KV block bookkeeping: pure Python, no tensors (token ids in, block ids out).

The KV pool is cut into ``num_blocks`` blocks of ``block_size`` token slots. This module only
decides which block holds what; ``kv_pool.py`` owns the tensors.

Contract:
- A *full* block can be registered in the prefix cache under a ``BlockHash`` that chains its
  parent block's hash, its own token ids and a salt (the session key), so two sessions never
  share a block and a block's hash identifies the whole prefix up to it.
- ``match`` walks a prompt block by block and stops at the first miss. A hit re-checks the block's
  stored key (parent hash, token ids, salt), so a hash collision can never serve foreign KV.
- Every block has a reference count. A block with count 0 sits in the free queue, an O(1) LRU
  list (intrusive doubly linked, as in vLLM v1): ``allocate`` takes blocks from its head and
  evicts their cached hash there and then; released blocks go to its tail. A cached block with
  count 0 stays matchable until it is evicted. Blocks in use (count > 0) are never evicted.
- ``decref`` takes a sequence's blocks in prompt order and releases them tail-first, so the
  newest blocks of a prefix are evicted before the older ones that more prompts share.
- Other holders (the segment cache) may ``incref`` blocks to keep them alive and ``decref`` them
  later; ``allocate(n)`` hands out fresh blocks with count 1.
- Every mutating call has a read-only check: ``can_allocate`` before ``allocate``.
- ``on_evict`` (optional, e.g. the KV tier) sees every cached block that ``allocate`` is about
  to reuse, while its hash, key and KV are still intact; ``reset`` and ``forget`` drop hashes
  without calling it.

This class is not thread-safe: one thread (the engine's driver) owns it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NewType

from suffixmem.errors import CapacityError

BlockHash = NewType("BlockHash", bytes)
"""A block's chained hash (16 bytes of BLAKE2b by default)."""

HashFn = Callable[["BlockHash | None", tuple[int, ...], str], BlockHash]


def hash_block(parent: BlockHash | None, token_ids: tuple[int, ...], salt: str) -> BlockHash:
    """BLAKE2b-128 of (parent hash, salt, token ids): the default chained block hash."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent if parent is not None else b"\x00" * 16)
    h.update(salt.encode())
    h.update(b"\xff")  # separates the salt from the token bytes
    h.update(array("q", token_ids).tobytes())
    return BlockHash(h.digest())


@dataclass(slots=True, eq=False)
class Block:
    """One block of ``block_size`` KV slots. ``key`` is what its hash was computed from."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    key: tuple[BlockHash | None, tuple[int, ...], str] | None = None
    prev_free: Block | None = None
    next_free: Block | None = None

    def __repr__(self) -> str:  # the linked-list fields would recurse
        return f"Block({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeBlockQueue:
    """Doubly linked list of free blocks through their ``prev_free``/``next_free`` fields.

    Head = least recently freed (evicted first); tail = most recently freed. Removing a block from
    the middle (a cache hit revives it) is O(1), which a ``deque`` cannot do.
    """

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)  # sentinels: never handed out
        self._tail = Block(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free = 0
        for b in blocks:
            self.append(b)

    def append(self, block: Block) -> None:
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free += 1

    def popleft(self) -> Block:
        first = self._head.next_free
        if first is None or first is self._tail:
            raise IndexError("no free block")
        self.remove(first)
        return first

    def remove(self, block: Block) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free -= 1

    def block_ids(self) -> list[int]:
        """Free block ids from head (next to evict) to tail."""
        out = []
        b = self._head.next_free
        while b is not None and b is not self._tail:
            out.append(b.block_id)
            b = b.next_free
        return out


@dataclass(slots=True, frozen=True)
class Match:
    """A prefix-cache hit: ``block_ids`` hold the first ``num_cached_tokens`` prompt tokens."""

    block_ids: tuple[int, ...]
    num_cached_tokens: int
    block_hashes: tuple[BlockHash, ...] = ()
    num_exact_tokens: int = 0  # leading tokens matched under the exact salt (== cached if exact)


class BlockPool:
    """Blocks, their reference counts, the prefix-cache hash map and the LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = hash_block) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[BlockHash, Block] = {}
        self.num_evicted = 0
        self.on_evict: Callable[[Block], None] | None = None

    # -- views ----------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that ``allocate`` may hand out now (free, cached or not)."""
        return self.free_queue.num_free

    @property
    def num_used(self) -> int:
        """Blocks with a reference count above 0."""
        return self.num_blocks - self.free_queue.num_free

    @property
    def num_cached_blocks(self) -> int:
        return len(self.cached)

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_cnt

    def is_cached(self, block_id: int) -> bool:
        return self.blocks[block_id].block_hash is not None

    def free_block_ids(self) -> list[int]:
        """The free queue from next-to-evict to most recently freed."""
        return self.free_queue.block_ids()

    # -- hashing and lookup ---------------------------------------------------------------------
    def block_hashes(self, token_ids: Sequence[int], salt: str,
                     parent: BlockHash | None = None) -> list[BlockHash]:
        """Chained hashes of the full blocks of ``token_ids`` (a trailing partial block has
        none), continuing from ``parent``."""
        out: list[BlockHash] = []
        bs = self.block_size
        for i in range(len(token_ids) // bs):
            parent = self.hash_fn(parent, tuple(token_ids[i * bs:(i + 1) * bs]), salt)
            out.append(parent)
        return out

    def _lookup(self, parent: BlockHash | None, chunk: tuple[int, ...],
                salt: str) -> tuple[Block, BlockHash] | None:
        h = self.hash_fn(parent, chunk, salt)
        block = self.cached.get(h)
        # the re-check: equal hashes must also mean equal parent, tokens and salt
        if block is None or block.key != (parent, chunk, salt):
            return None
        return block, h

    def match(self, token_ids: Sequence[int], salt: str, max_tokens: int | None = None,
              approx_salt: str | None = None, public_blocks: int = 0,
              public_salt: str | None = None) -> Match:
        """The longest run of cached full blocks that starts ``token_ids``. Read-only.

        ``max_tokens`` caps the hit (an engine passes ``len(prompt) - 1`` so that at least the
        last prompt token is computed). With ``approx_salt``, once a block misses under ``salt``
        the walk continues under ``approx_salt`` only (blocks whose KV is approximate, from
        segment reuse); ``num_exact_tokens`` says where that switch happened. With
        ``public_salt``, the first ``public_blocks`` blocks are looked up under it instead of
        ``salt`` (the public-prefix isolation scope; see ``suffixmem.engine.isolation``).
        """
        bs = self.block_size
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        ids: list[int] = []
        hashes: list[BlockHash] = []
        parent: BlockHash | None = None
        approx = False
        exact = 0
        for i in range(limit // bs):
            chunk = tuple(token_ids[i * bs:(i + 1) * bs])
            hit = None
            if not approx:
                want = public_salt if public_salt is not None and i < public_blocks else salt
                hit = self._lookup(parent, chunk, want)
                approx = hit is None and approx_salt is not None
            if approx:
                assert approx_salt is not None
                hit = self._lookup(parent, chunk, approx_salt)
            if hit is None:
                break
            block, parent = hit
            ids.append(block.block_id)
            hashes.append(parent)
            if not approx:
                exact = len(ids) * bs
        return Match(tuple(ids), len(ids) * bs, tuple(hashes), exact)

    # -- reference counts -----------------------------------------------------------------------
    def can_allocate(self, num_new: int, reuse: Sequence[int] = ()) -> bool:
        """Whether ``incref(reuse)`` then ``allocate(num_new)`` would succeed now.

        Reviving a free cached block takes it out of the free queue, so those count too."""
        revived = sum(1 for b in set(reuse) if self.blocks[b].ref_cnt == 0)
        return num_new + revived <= self.free_queue.num_free

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with reference count 1, taken from the head of the free queue
        (least recently freed first); a cached block taken there loses its hash (eviction)."""
        if n > self.free_queue.num_free:
            raise CapacityError(
                f"KV pool exhausted: {n} blocks wanted, {self.free_queue.num_free} free of "
                f"{self.num_blocks} (the rest are in use)"
            )
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if self.on_evict is not None and block.block_hash is not None:
                self.on_evict(block)  # its KV is still in the pool until the caller writes
            self._evict(block)
            block.ref_cnt = 1
            out.append(block.block_id)
        return out

    def _evict(self, block: Block) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash = None
            block.key = None
            self.num_evicted += 1

    def incref(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on each block; a free block leaves the free queue (a cache
        hit revives it) and keeps its hash."""
        for bid in block_ids:
            block = self.blocks[bid]
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def decref(self, block_ids: Sequence[int]) -> None:
        """Drop one reference on each block, tail-first (``block_ids`` in sequence order).

        A block reaching 0 goes to the tail of the free queue and keeps its hash, so it stays
        matchable until ``allocate`` evicts it."""
        for bid in reversed(block_ids):
            block = self.blocks[bid]
            if block.ref_cnt <= 0:
                raise ValueError(f"decref of block {bid} whose reference count is 0")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    # -- the prefix cache -----------------------------------------------------------------------
    def cache_block(self, block_id: int, parent: BlockHash | None, token_ids: Sequence[int],
                    salt: str) -> BlockHash:
        """Register full block ``block_id`` (holding ``token_ids`` after the prefix hashed as
        ``parent``) in the prefix cache and return its hash.

        If another block already holds the same key, that one stays the cached copy and this
        block stays unregistered (it is freed like any uncached block)."""
        chunk = tuple(token_ids)
        if len(chunk) != self.block_size:
            raise ValueError(f"only full blocks are cached: {len(chunk)} != {self.block_size}")
        block = self.blocks[block_id]
        h = self.hash_fn(parent, chunk, salt)
        if block.block_hash is not None:
            if block.block_hash == h and block.key == (parent, chunk, salt):
                return h
            raise ValueError(f"block {block_id} is already cached under another key")
        if h not in self.cached:
            self.cached[h] = block
            block.block_hash = h
            block.key = (parent, chunk, salt)
        return h

    def cached_blocks(self) -> list[Block]:
        """Every block holding a cached hash (in use or free), in block id order."""
        return [b for b in self.blocks if b.block_hash is not None]

    def forget(self, salts: Iterable[str]) -> int:
        """Drop the cached hashes of every block under ``salts`` (a deleted session), without
        ``on_evict``, so no later lookup finds them. Blocks in use lose their hash too (the
        segment cache may hold a session's blocks): their KV stays with their holders, and
        they return to the free queue uncached. Returns how many were dropped."""
        wanted = set(salts)
        dropped = 0
        for block in self.blocks:
            if block.key is not None and block.key[2] in wanted:
                self._evict(block)
                dropped += 1
        return dropped

    def reset(self) -> int:
        """Forget every cached hash of a free block (blocks in use keep theirs). Returns the
        number of hashes dropped."""
        dropped = 0
        for block in self.blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped
