"""Segment cache bookkeeping over the real block pool: keys, TTL, tiers, isolation, budget."""

from __future__ import annotations

import math

import pytest

from suffixmem.engine.reuse.segment_cache import (
    GLOBAL_NAMESPACE,
    SegmentCache,
    SegmentCacheConfig,
    SegmentFeatures,
    Tier,
    namespace_for,
    segment_key,
)
from suffixmem.engine.torch.block_pool import BlockPool
from suffixmem.errors import ConfigError
from suffixmem.retention import LRU, HeuristicValueScorer, PinnedLRU, SecondHit, make_policy

IDS = tuple(range(100, 120))  # a 20-token segment
OTHER = tuple(range(200, 230))


class Clock:
    """A hand-driven monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FixedScorer:
    def __init__(self, value: float) -> None:
        self.value = value
        self.calls: list[SegmentFeatures] = []

    def score(self, features: SegmentFeatures) -> float:
        self.calls.append(features)
        return self.value


def make(scorer=None, **cfg):  # type: ignore[no-untyped-def]
    pool = BlockPool(num_blocks=64, block_size=4)
    clock = Clock()
    cache = SegmentCache(pool, SegmentCacheConfig(**cfg), scorer=scorer, clock=clock)
    return pool, clock, cache


def put(cache: SegmentCache, pool: BlockPool, session: str = "s1", ids=IDS, **kw):  # type: ignore[no-untyped-def]
    """Allocate blocks as a sequence would, cache the segment, then let the sequence go."""
    n = -(-(len(ids) + 2) // pool.block_size)
    blocks = pool.allocate(n)
    hit = cache.put(session, ids, blocks, offset=2, origin_start=7, **kw)
    pool.decref(blocks)  # the sequence finishes; only the cache holds them now
    return blocks, hit


def test_hit_returns_the_blocks_and_layout() -> None:
    pool, _, cache = make()
    blocks, hit = put(cache, pool)
    assert hit is not None and hit.tier is Tier.STANDARD
    found = cache.lookup("s1", IDS)
    assert found == hit
    assert found.block_ids == tuple(blocks) and found.offset == 2 and found.origin_start == 7
    assert found.num_tokens == len(IDS)
    assert all(pool.ref_count(b) == 1 for b in blocks)
    assert cache.lookup("s1", IDS[:-1]) is None


def test_ttl_expiry_frees_blocks_and_is_never_served() -> None:
    pool, clock, cache = make(session_ttl_s=300.0)
    blocks, _ = put(cache, pool)
    clock.now += 299.0
    assert cache.lookup("s1", IDS) is not None  # a use restarts the TTL
    clock.now += 299.0
    assert cache.contains("s1", IDS)
    clock.now += 1.0  # exactly 300 s after the last use
    assert not cache.contains("s1", IDS)
    assert cache.lookup("s1", IDS) is None
    assert all(pool.ref_count(b) == 0 for b in blocks)
    assert len(cache) == 0 and cache.stats().expired == 1


def test_evict_expired_sweeps() -> None:
    pool, clock, cache = make()
    put(cache, pool, ids=IDS)
    put(cache, pool, ids=OTHER)
    clock.now += 301
    assert cache.evict_expired() == 2
    assert pool.num_used == 0


@pytest.mark.parametrize(
    ("score", "tier", "alive_after"),
    [
        (0.95, Tier.PINNED, math.inf),
        (0.85, Tier.PINNED, math.inf),
        (0.84, Tier.EXTENDED, 1800.0),
        (0.6, Tier.EXTENDED, 1800.0),
        (0.59, Tier.NONE, 0.0),
    ],
)
def test_value_tiers(score: float, tier: Tier, alive_after: float) -> None:
    scorer = FixedScorer(score)
    pool, clock, cache = make(scorer=scorer)
    blocks, hit = put(cache, pool, kind="document")
    assert scorer.calls and scorer.calls[0].kind == "document"
    assert scorer.calls[0].num_tokens == len(IDS)
    if tier is Tier.NONE:
        assert hit is None and len(cache) == 0
        assert all(pool.ref_count(b) == 0 for b in blocks)
        return
    assert hit is not None and hit.tier is tier and hit.score == score
    clock.now += 1799.0
    assert cache.contains("s1", IDS)
    clock.now += 1.0
    assert cache.contains("s1", IDS) == (alive_after > 1800.0)
    clock.now += 10**7
    assert cache.contains("s1", IDS) == (tier is Tier.PINNED)


def test_explicit_score_overrides_scorer() -> None:
    scorer = FixedScorer(0.1)
    pool, _, cache = make(scorer=scorer)
    _, hit = put(cache, pool, score=0.9)
    assert hit is not None and hit.tier is Tier.PINNED and not scorer.calls


def test_session_isolation_and_shared_namespace() -> None:
    pool, _, cache = make()
    put(cache, pool, "alice", IDS)
    assert cache.lookup("bob", IDS) is None
    assert not cache.contains("bob", IDS)
    put(cache, pool, "alice", OTHER, shared=True)
    assert cache.lookup("bob", OTHER) is not None
    assert cache.lookup("alice", OTHER) is not None
    assert segment_key(IDS, namespace_for("alice", False)) != segment_key(
        IDS, namespace_for("bob", False)
    )
    assert namespace_for("x", True) == GLOBAL_NAMESPACE


def test_release_session_drops_own_entries_only() -> None:
    pool, _, cache = make()
    a_blocks, _ = put(cache, pool, "alice", IDS)
    put(cache, pool, "bob", IDS)
    put(cache, pool, "alice", OTHER, shared=True)
    assert cache.release_session("alice") == 1
    assert cache.lookup("alice", IDS) is None
    assert cache.lookup("bob", IDS) is not None
    assert cache.lookup("alice", OTHER) is not None  # shared survives
    assert all(pool.ref_count(b) == 0 for b in a_blocks)


def test_lease_keeps_blocks_alive_through_a_release() -> None:
    pool, _, cache = make()
    blocks, _ = put(cache, pool)
    with cache.leased("s1", IDS) as hit:
        assert hit is not None
        cache.release_session("s1")
        assert all(pool.ref_count(b) == 1 for b in blocks)  # the lease's reference
    assert all(pool.ref_count(b) == 0 for b in blocks)
    with cache.leased("s1", IDS) as hit:
        assert hit is None


def test_budget_evicts_lru_unpinned_and_keeps_pinned() -> None:
    pool, _, cache = make(max_blocks=12)  # each 20-token segment at offset 2 takes 6 blocks
    a = tuple(range(1, 21))
    b = tuple(range(21, 41))
    c = tuple(range(41, 61))
    put(cache, pool, ids=a, score=0.9)  # pinned
    put(cache, pool, ids=b)
    assert cache.lookup("s1", a) is not None  # a is used more recently than b
    put(cache, pool, ids=c)  # over budget: b goes, pinned a stays
    assert cache.contains("s1", a) and cache.contains("s1", c)
    assert not cache.contains("s1", b)
    assert cache.stats().evicted == 1
    # pool pressure: live requests come first, so pinned entries go too, after the others
    assert cache.evict(1) == 6 and cache.contains("s1", a) and not cache.contains("s1", c)
    assert cache.evict(100) == 6 and len(cache) == 0
    # a segment larger than the whole budget is refused
    big = tuple(range(1000, 1050))
    blocks, hit = put(cache, pool, ids=big)
    assert hit is None and all(pool.ref_count(x) == 0 for x in blocks)


def test_a_budget_full_of_pinned_segments_still_admits_new_ones() -> None:
    """Pinned entries never expire and go last, but they do go: otherwise shared passages that
    fill the budget would shut the cache to every later segment."""
    pool, _, cache = make(max_blocks=12)
    a, b, c = (tuple(range(s, s + 20)) for s in (1, 21, 41))
    _, first = put(cache, pool, ids=a, shared=True)  # the default policy pins shared segments
    put(cache, pool, ids=b, shared=True)
    assert first is not None and first.tier is Tier.PINNED
    assert cache.lookup("s2", a) is not None  # a is now used more recently than b
    _, hit = put(cache, pool, ids=c)  # full of pinned entries: the least recently used goes
    assert hit is not None and cache.contains("s1", c)
    assert cache.contains("s3", a) and not cache.contains("s3", b)
    assert cache.stats().evicted == 1


def test_reput_of_live_entry_keeps_the_first_copy() -> None:
    pool, _, cache = make()
    first, hit1 = put(cache, pool)
    second, hit2 = put(cache, pool)
    assert hit1 == hit2 and hit2 is not None and hit2.block_ids == tuple(first)
    assert all(pool.ref_count(b) == 0 for b in second)


def test_short_segments_are_rejected() -> None:
    pool, _, cache = make(min_tokens=8)
    blocks, hit = put(cache, pool, ids=tuple(range(7)))
    assert hit is None and all(pool.ref_count(b) == 0 for b in blocks)


def test_clear_releases_pinned_too() -> None:
    pool, _, cache = make()
    put(cache, pool, score=1.0)
    cache.clear()
    assert len(cache) == 0 and pool.num_used == 0


def test_heuristic_scorer_rewards_structure_and_recurrence() -> None:
    scorer = HeuristicValueScorer()
    pool, _, cache = make(scorer=scorer)
    doc = SegmentFeatures(num_tokens=200, kind="document", shared=False)
    det = SegmentFeatures(num_tokens=200, kind="detected", shared=False)
    sys_ = SegmentFeatures(num_tokens=200, kind="system_tail", shared=True)
    assert cache.tier_of(sys_) is Tier.PINNED
    assert cache.tier_of(doc) is Tier.NONE  # a document seen once is not worth keeping
    assert cache.tier_of(SegmentFeatures(200, "document", False, seen=1)) is Tier.EXTENDED
    assert cache.tier_of(det) is Tier.NONE
    assert scorer.score(SegmentFeatures(4, "document", False)) < scorer.score(doc)
    # a detected region is not cached on its first offer, but is once it has recurred
    hits = [put(cache, pool, ids=IDS, kind="detected")[1] for _ in range(2)]
    assert hits[0] is None
    assert hits[1] is not None and hits[1].tier is Tier.EXTENDED
    assert cache.contains("s1", IDS)


def test_default_policy_pins_shared_prefixes_and_keeps_the_rest_lru() -> None:
    pool, clock, cache = make(max_blocks=16)
    assert isinstance(cache.policy, PinnedLRU)
    _, shared = put(cache, pool, ids=IDS, shared=True, kind="system_tail")
    assert shared is not None and shared.tier is Tier.PINNED
    _, own = put(cache, pool, ids=OTHER, kind="document")
    assert own is not None and own.tier is Tier.STANDARD
    clock.now += 301.0  # past the session TTL: the session segment expires, the pinned stays
    assert not cache.contains("s1", OTHER)
    assert cache.contains("s2", IDS)
    # space pressure evicts LRU entries, never the pinned shared one
    for i in range(3):
        put(cache, pool, ids=tuple(range(300 + 40 * i, 330 + 40 * i)))
    assert cache.contains("s3", IDS)


def test_second_hit_admission_and_plain_lru() -> None:
    pool = BlockPool(num_blocks=64, block_size=4)
    cache = SegmentCache(pool, policy=SecondHit(), clock=Clock())
    assert put(cache, pool)[1] is None  # first sighting: not admitted
    second = put(cache, pool)[1]
    assert second is not None and second.tier is Tier.STANDARD
    lru = SegmentCache(pool, policy=LRU(), clock=Clock())
    hit = put(lru, pool, shared=True)[1]
    assert hit is not None and hit.tier is Tier.STANDARD  # plain LRU pins nothing
    with pytest.raises(ConfigError, match="retention policy or a value scorer"):
        SegmentCache(pool, policy=LRU(), scorer=HeuristicValueScorer())
    with pytest.raises(ConfigError, match="unknown retention policy"):
        make_policy("fifo")
    assert isinstance(make_policy(), PinnedLRU)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_ttl_s": 0},
        {"extended_ttl_s": -1},
        {"pinned_threshold": 0.5, "cache_threshold": 0.6},
        {"pinned_threshold": 1.5},
        {"max_blocks": -1},
        {"min_tokens": 0},
    ],
)
def test_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        SegmentCacheConfig(**kwargs)


def test_scores_outside_unit_interval_are_rejected() -> None:
    pool, _, cache = make(scorer=FixedScorer(1.5))
    with pytest.raises(ConfigError):
        put(cache, pool)
