"""The three conversation benches run end to end (small sizes) and report what they claim."""

from __future__ import annotations

from typing import Any

import pytest

from suffixmem_bench.retention import (
    POLICY_NAMES,
    T0,
    replay_lru,
    replay_policy,
    run_retention,
)


def test_retention_bench_small() -> None:
    r = run_retention(seed=2, sessions=80)
    default = r["default_budget_tokens"]
    # the engine's default: a quarter of the default 1 GiB pool, whole 16-token blocks
    assert default == r["budget_tokens"] and default % 16 == 0 and 10_000 < default < 13_000
    assert [row["budget_tokens"] for row in r["sweep"]] == sorted(
        {3_000, 5_000, 10_000, 20_000, 40_000, default})
    row = next(x for x in r["sweep"] if x["budget_tokens"] == default)
    assert r["value_tokens_saved"] == row["value"] and r["lru_tokens_saved"] == row["lru"]
    assert 0 < r["lru_tokens_saved"] <= r["replayed_tokens"]
    assert r["library_default_policy"] == "pinned-lru"
    assert r["best_policy_at_default"] == max(POLICY_NAMES, key=lambda n: row[n])
    assert r["default_is_best"] == (row["pinned-lru"] >= max(row[n] for n in POLICY_NAMES))
    for name in ("lru_no_ttl", "plain_lru_tokens"):
        saved = [x[name] for x in r["sweep"]]
        assert saved == sorted(saved)  # LRU with no expiry never saves less with more room
    # the cache class replays plain LRU up to block rounding
    assert abs(row["lru_no_ttl"] - row["plain_lru_tokens"]) <= 0.02 * row["plain_lru_tokens"]


def test_replay_through_the_segment_cache_counts_hits_exactly() -> None:
    from datetime import timedelta

    from suffixmem.conversation.records import SegmentEvent
    from suffixmem.engine.reuse.segment_cache import SegmentCacheConfig
    from suffixmem.retention import LRU, PinnedLRU

    def ev(t: float, h: str, tokens: int, scope: str = "s1") -> SegmentEvent:
        return SegmentEvent(h, scope, "s1" if scope == "*" else scope, "document", tokens,
                            T0 + timedelta(seconds=t), False,
                            {"num_tokens": tokens, "shared": scope == "*"})

    # a 64-token budget (4 blocks): the shared 32-token prompt, then two 32-token documents
    events = [ev(0, "sys", 32, "*"), ev(1, "a", 32), ev(2, "b", 32), ev(3, "sys", 32, "*"),
              ev(4, "a", 32), ev(1000, "b", 32)]
    # LRU: b evicts sys; sys evicts a; a evicts b; b (TTL 300 s) would have expired anyway
    assert replay_policy(events, 64, LRU()) == 0
    # pinned: sys stays, a and b take turns in the other two blocks; sys hits once
    assert replay_policy(events, 64, PinnedLRU()) == 32
    # room for all: sys, a and b hit with no expiry; with the 5-minute TTL b has expired
    assert replay_lru(events, 96) == 96
    no_ttl = SegmentCacheConfig(max_blocks=6, session_ttl_s=1e15, extended_ttl_s=1e15)
    assert replay_policy(events, 96, LRU(), config=no_ttl) == 96
    assert replay_policy(events, 96, LRU()) == 64


@pytest.mark.slow
@pytest.mark.vllm
def test_layout_bench_on_vllm(vllm_engine: Any) -> None:
    from suffixmem_bench.layout import run_layout

    r = run_layout(turns=10, context_window=320, max_tokens=16, engine=vllm_engine)
    assert r["suffixmem_evictions"] >= 1 and r["sliding_window_evictions"] >= 1
    assert r["suffixmem_evictions"] < r["sliding_window_evictions"]
    assert 0.0 <= r["sliding_window_hit_rate"] < r["suffixmem_hit_rate"] <= 1.0
    _check_layout_figures(r, 10)


def _check_layout_figures(r: dict[str, Any], turns: int) -> None:
    for name in ("stable", "sliding"):
        f = r["layouts"][name]
        assert f["tokens_computed"] == f["prompt_tokens"] - f["cached_tokens"] > 0
        # history was evicted, so fewer earlier turns than the session had are kept
        assert 0 < f["turns_kept_final"] < turns - 1
        assert 0 < f["turns_kept_mean"] < (turns - 1) / 2


@pytest.mark.slow
def test_layout_bench_on_torch_counts_kept_turns_and_computed_tokens() -> None:
    from suffixmem.engine import create_engine
    from suffixmem_bench.layout import run_layout

    engine = create_engine("torch", max_model_len=1024, kv_cache_gib=0.25)
    try:
        r = run_layout(turns=10, context_window=320, max_tokens=16, engine=engine)
    finally:
        engine.close()
    assert r["engine"] == "torch" and r["suffixmem_evictions"] >= 1
    _check_layout_figures(r, 10)
