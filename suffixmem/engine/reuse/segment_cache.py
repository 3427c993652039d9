"""The segment cache: which token spans have reusable KV, in which blocks, for how long.

Pure Python bookkeeping, no tensors. An entry names KV blocks of the engine's pool and holds one
reference on each of them (``BlockRefs.incref``) until it is dropped (``decref``); the KV itself
stays in the pool. Contract:

- **Keys.** A segment is keyed by a hash of its token ids combined with a namespace: the
  request's session key, or the global namespace for ``shared`` segments (a common system
  prompt). A lookup in session ``s`` sees ``s``'s entries and shared ones, never another
  session's; a hit re-checks the stored token ids, so a hash collision is a miss.
- **Lifetime.** A ``suffixmem.retention`` policy picks each segment's tier (the same policy
  object the manager's segment log uses). The default, ``PinnedLRU``, pins shared segments (no
  expiry; evicted for space only when no unpinned entry is left) and keeps session segments
  ``session_ttl_s`` (5 minutes) after their last use, least recently used evicted first. With
  a value scorer (``scorer=``, i.e. ``ValueTiers``) the score picks the tier:
  ``>= pinned_threshold`` (0.85) pinned, ``[cache_threshold, pinned_threshold)`` lives
  ``extended_ttl_s`` (30 minutes) after its last use, below is not cached. Times come from an
  injectable clock (seconds).
- **Never stale.** Expired, evicted, released or foreign-session entries are never returned:
  ``lookup`` checks expiry against the clock before answering.
- **Leases.** ``leased(...)`` hands out a hit whose blocks carry an extra reference for the
  duration of the ``with`` block, so a concurrent ``release_session`` or eviction cannot recycle
  them while the engine copies their KV.

Keys, namespaces and ``SegmentHit`` live in ``segment_keys``, the settings in
``segment_cache_config``; both are re-exported here.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from suffixmem.engine.reuse.segment_cache_config import SegmentCacheConfig
from suffixmem.engine.reuse.segment_keys import (
    GLOBAL_NAMESPACE,
    BlockRefs,
    SegmentHit,
    SegmentKey,
    namespace_for,
    segment_key,
)
from suffixmem.errors import ConfigError
from suffixmem.retention import (
    Decision,
    PinnedLRU,
    RetentionPolicy,
    SegmentFeatures,
    Tier,
    ValueScorer,
    ValueTiers,
)

__all__ = [
    "GLOBAL_NAMESPACE", "BlockRefs", "RetentionPolicy", "SegmentCache", "SegmentCacheConfig",
    "SegmentCacheStats", "SegmentFeatures", "SegmentHit", "SegmentKey", "Tier", "ValueScorer",
    "namespace_for", "segment_key",
]


@dataclass(slots=True)
class _Entry:
    hit: SegmentHit
    namespace: str
    expires_at: float
    last_used: float
    uses: int = 0


@dataclass(slots=True)
class SegmentCacheStats:
    """Counters since the cache was created."""

    entries: int = 0  # segments held now
    tokens: int = 0  # ... their tokens
    blocks: int = 0  # ... and the pool blocks they hold a reference to
    hits: int = 0  # lookups served from the cache
    misses: int = 0  # lookups that found nothing usable
    stored: int = 0  # segments put
    rejected: int = 0  # offered, but refused by the policy, the size floor or the budget
    expired: int = 0  # dropped when their time to live ran out
    evicted: int = 0  # dropped to make room
    released: int = 0  # dropped by release_session (a topic jump, a deleted session)


class SegmentCache:
    """Segment entries over an engine's block pool; thread-safe."""

    def __init__(
        self,
        blocks: BlockRefs,
        config: SegmentCacheConfig | None = None,
        scorer: ValueScorer | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        policy: RetentionPolicy | None = None,
    ) -> None:
        """``policy`` decides tiers (default ``PinnedLRU``); giving ``scorer`` instead means
        ``ValueTiers(scorer)`` with this config's thresholds."""
        self.config = config or SegmentCacheConfig()
        if policy is not None and scorer is not None:
            raise ConfigError("give a retention policy or a value scorer, not both")
        self.scorer = scorer
        self.policy: RetentionPolicy = policy or (
            ValueTiers(scorer, self.config.pinned_threshold, self.config.cache_threshold)
            if scorer is not None else PinnedLRU())
        self._blocks = blocks
        self._clock = clock
        # LRU order: least recently used first
        self._entries: OrderedDict[SegmentKey, _Entry] = OrderedDict()
        # offers per key (drives SegmentFeatures.seen), with the key's namespace
        self._seen: dict[SegmentKey, tuple[str, int]] = {}
        self._num_blocks = 0
        self._stats = SegmentCacheStats()
        self._lock = threading.RLock()

    # -- queries --------------------------------------------------------------------------------
    def lookup(self, session_key: str, token_ids: Sequence[int]) -> SegmentHit | None:
        """The live entry for ``token_ids`` in the session's namespace, else the global one.

        A hit counts as a use: it moves the entry to the back of the LRU order and restarts its
        TTL. Expired entries met here are dropped and reported as a miss.
        """
        ids = tuple(token_ids)
        now = self._clock()
        with self._lock:
            for shared in (False, True):
                ns = namespace_for(session_key, shared)
                key = segment_key(ids, ns)
                entry = self._entries.get(key)
                if entry is None or entry.namespace != ns or entry.hit.token_ids != ids:
                    continue
                if entry.expires_at <= now:
                    self._drop(key, "expired")
                    continue
                entry.last_used = now
                entry.uses += 1
                entry.expires_at = now + self.config.ttl(entry.hit.tier)
                self._entries.move_to_end(key)
                self._stats.hits += 1
                return entry.hit
            self._stats.misses += 1
            return None

    def contains(self, session_key: str, token_ids: Sequence[int]) -> bool:
        """Whether ``lookup`` would hit now; changes nothing."""
        ids = tuple(token_ids)
        now = self._clock()
        with self._lock:
            for shared in (False, True):
                ns = namespace_for(session_key, shared)
                entry = self._entries.get(segment_key(ids, ns))
                if (
                    entry is not None and entry.namespace == ns and entry.hit.token_ids == ids
                    and entry.expires_at > now
                ):
                    return True
            return False

    @contextmanager
    def leased(self, session_key: str, token_ids: Sequence[int]) -> Iterator[SegmentHit | None]:
        """``lookup``, with the hit's blocks held for the duration of the ``with`` block."""
        with self._lock:
            hit = self.lookup(session_key, token_ids)
            if hit is not None:
                self._blocks.incref(hit.block_ids)
        try:
            yield hit
        finally:
            if hit is not None:
                self._blocks.decref(hit.block_ids)

    def tier_of(self, features: SegmentFeatures, score: float | None = None) -> Tier:
        """The tier ``put`` would give a segment with these features (read-only twin of put)."""
        return self._decide(features, score).tier

    def _decide(self, features: SegmentFeatures, score: float | None) -> Decision:
        if score is not None:  # an explicit score overrides the policy
            return Decision(self.config.tier(score), score)
        return self.policy.decide(features)

    # -- mutation -------------------------------------------------------------------------------
    def put(
        self,
        session_key: str,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        offset: int,
        origin_start: int,
        *,
        kind: str = "anchor",
        shared: bool = False,
        score: float | None = None,
        features: SegmentFeatures | None = None,
    ) -> SegmentHit | None:
        """Cache the KV of ``token_ids`` found in ``block_ids`` from slot ``offset`` on, keys
        rotated for positions ``origin_start...``. Takes one reference on each block.

        The tier comes from ``score`` (this config's thresholds), else from the retention
        policy on ``features`` (built from the arguments when not given). Returns the live
        entry (an existing live entry for the same ids is kept, refreshed and returned), or
        ``None`` when the segment is too short, is not admitted (tier ``NONE``), or cannot fit
        the block budget.
        """
        ids = tuple(int(t) for t in token_ids)
        blocks = tuple(int(b) for b in block_ids)
        if offset < 0 or origin_start < 0:
            raise ValueError(f"offset and origin_start must be >= 0: {offset}, {origin_start}")
        if not blocks:
            raise ValueError("a segment needs at least one block")
        ns = namespace_for(session_key, shared)
        key = segment_key(ids, ns)
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key, (ns, 0))[1]
            self._seen[key] = (ns, seen + 1)
            if len(ids) < self.config.min_tokens:
                self._stats.rejected += 1
                return None
            existing = self._entries.get(key)
            if existing is not None and existing.hit.token_ids == ids and existing.expires_at > now:
                existing.last_used = now
                existing.expires_at = now + self.config.ttl(existing.hit.tier)
                self._entries.move_to_end(key)
                return existing.hit
            if existing is not None:
                self._drop(key, "expired")
            if features is None:
                features = SegmentFeatures(
                    num_tokens=len(ids), kind=kind, shared=shared, seen=seen,
                    position=origin_start,
                )
            decision = self._decide(features, score)
            tier, score = decision.tier, decision.score
            if tier is Tier.NONE:
                self._stats.rejected += 1
                return None
            if not self._make_room(len(blocks), now):
                self._stats.rejected += 1
                return None
            self._blocks.incref(blocks)
            hit = SegmentHit(key, ids, blocks, offset, origin_start, tier, shared, score)
            self._entries[key] = _Entry(hit, ns, now + self.config.ttl(tier), now)
            self._num_blocks += len(blocks)
            self._stats.stored += 1
            return hit

    def release_session(self, session_key: str) -> int:
        """Drop every entry of the session's own namespace (shared ones stay). Returns how many
        entries were dropped. Called on a topic jump and when a session ends."""
        ns = namespace_for(session_key, False)
        with self._lock:
            doomed = [k for k, e in self._entries.items() if e.namespace == ns]
            for k in doomed:
                self._drop(k, "released")
            self._seen = {k: v for k, v in self._seen.items() if v[0] != ns}
            return len(doomed)

    def evict_expired(self) -> int:
        """Drop every expired entry now; returns how many."""
        now = self._clock()
        with self._lock:
            doomed = [k for k, e in self._entries.items() if e.expires_at <= now]
            for k in doomed:
                self._drop(k, "expired")
            return len(doomed)

    def evict(self, num_blocks: int) -> int:
        """Drop least recently used entries, unpinned ones first, until ``num_blocks`` block
        references are given back (or none is left to drop). Returns the number given back.
        The torch engine's scheduler calls this when its pool runs short (``Scheduler.reclaim``):
        live requests come before any cached segment, pinned ones included."""
        freed = 0
        with self._lock:
            freed += self._blocks_of(self._expired_keys(self._clock()), "expired")
            for key in self._eviction_order():
                if freed >= num_blocks:
                    break
                freed += self._blocks_of([key], "evicted")
        return freed

    def clear(self) -> None:
        """Drop everything, pinned entries included."""
        with self._lock:
            for k in list(self._entries):
                self._drop(k, "released")
            self._seen.clear()

    def stats(self) -> SegmentCacheStats:
        with self._lock:
            s = self._stats
            return SegmentCacheStats(
                len(self._entries), sum(e.hit.num_tokens for e in self._entries.values()),
                self._num_blocks, s.hits, s.misses, s.stored, s.rejected, s.expired, s.evicted,
                s.released,
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- internals ------------------------------------------------------------------------------
    def _expired_keys(self, now: float) -> list[SegmentKey]:
        return [k for k, e in self._entries.items() if e.expires_at <= now]

    def _blocks_of(self, keys: list[SegmentKey], reason: str) -> int:
        n = 0
        for k in keys:
            n += len(self._entries[k].hit.block_ids)
            self._drop(k, reason)
        return n

    def _eviction_order(self) -> list[SegmentKey]:
        """Keys to evict, in order: unpinned entries least recently used first, then pinned
        ones likewise."""
        unpinned = [k for k, e in self._entries.items() if e.hit.tier is not Tier.PINNED]
        return unpinned + [k for k, e in self._entries.items() if e.hit.tier is Tier.PINNED]

    def _make_room(self, need: int, now: float) -> bool:
        budget = self.config.max_blocks
        if budget == 0:
            return True
        if need > budget:
            return False
        self._blocks_of(self._expired_keys(now), "expired")
        # pinned entries too, last: else a budget full of pinned segments (every shared
        # passage, under the default policy) would refuse every later segment for good
        for key in self._eviction_order():
            if self._num_blocks + need <= budget:
                break
            self._blocks_of([key], "evicted")
        return self._num_blocks + need <= budget

    def _drop(self, key: SegmentKey, reason: str) -> None:
        entry = self._entries.pop(key)
        self._num_blocks -= len(entry.hit.block_ids)
        self._blocks.decref(entry.hit.block_ids)
        if reason == "expired":
            self._stats.expired += 1
        elif reason == "evicted":
            self._stats.evicted += 1
        else:
            self._stats.released += 1
