"""Segment value: tiers, the fallback heuristic, labels from the SQL log, the learned scorer,
and the two retention policies on exact small replays."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from suffixmem.conversation.store import SegmentEvent, Store
from suffixmem.conversation.value import (
    HeuristicValueScorer,
    LearnedValueScorer,
    Tier,
    ValueFeatures,
    label_sightings,
    segment_hash,
    tier_of,
    token_entropy,
    train_value_scorer,
)
from suffixmem.retention import LRU, ValueTiers
from suffixmem_bench.retention import (
    T0,
    log_workload,
    replay_lru,
    replay_policy,
    simulate_workload,
)


def _ev(h: str, minutes: float, tokens: int = 50, **features: Any) -> SegmentEvent:
    feats = {"num_tokens": tokens, "kind": "document", **features}
    return SegmentEvent(h, "s", "s", "document", tokens, T0 + timedelta(minutes=minutes), False,
                        feats)


def test_tiers() -> None:
    assert tier_of(1.0) is Tier.PINNED and tier_of(0.85) is Tier.PINNED
    assert tier_of(0.8499) is Tier.EXTENDED and tier_of(0.6) is Tier.EXTENDED
    assert tier_of(0.5999) is Tier.NONE


def test_heuristic_fallback() -> None:
    h = HeuristicValueScorer()
    assert h.tier(h.score(ValueFeatures(300, "system_tail"))) is Tier.PINNED
    assert h.tier(h.score(ValueFeatures(300, "document"))) is Tier.NONE
    assert h.tier(h.score(ValueFeatures(300, "document", seen=1))) is Tier.EXTENDED
    assert h.score(ValueFeatures(8, "document", seen=3)) < h.score(
        ValueFeatures(300, "document", seen=3))
    # the segment cache's own feature type is scored too (read by attribute)
    from suffixmem.retention import SegmentFeatures

    assert h.score(SegmentFeatures(num_tokens=300, kind="system_tail", shared=True)) == 0.9


def test_hash_and_entropy() -> None:
    assert segment_hash([1, 2, 3]) == segment_hash((1, 2, 3)) != segment_hash([1, 2, 4])
    assert token_entropy([7] * 10) == 0.0
    assert token_entropy(list(range(16))) == pytest.approx(1.0)


def test_labels_from_the_log() -> None:
    events = [_ev("a", 0), _ev("a", 10), _ev("b", 0), _ev("c", 110), _ev("d", 120)]
    xs, ys = label_sightings(events, horizon_s=1800)
    # a@0 came back within 30 min (1); a@10 and b@0 never did, with 2 h of log after them (0);
    # c@110 and d@120 are within 30 min of the log's end: outcome unknown, left out
    assert ys == [1, 0, 0] and len(xs) == 3


def test_learned_scorer_from_sql(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'v.db'}")
    log_workload(store, simulate_workload(seed=1, sessions=120))
    events = store.segment_events()
    store.close()
    assert train_value_scorer(events[:50]).__class__ is HeuristicValueScorer  # too little data
    mid = len(events) // 2
    scorer = train_value_scorer(events[:mid])
    assert isinstance(scorer, LearnedValueScorer)
    from sklearn.metrics import roc_auc_score

    xs, ys = label_sightings(events[mid:])
    probs = scorer.model.predict_proba(xs)[:, 1]
    assert roc_auc_score(ys, probs) > 0.7  # it learned something that holds on later data
    assert 0.0 <= scorer.score(ValueFeatures(300, "system_tail", shared=True, seen=5)) <= 1.0


class FixedScorer:
    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores

    def score(self, features: Any) -> float:
        return self.scores[features.kind]

    def tier(self, score: float) -> Tier:
        return tier_of(score)


def test_replays_exactly() -> None:
    def ev(h: str, minute: float, kind: str) -> SegmentEvent:
        return SegmentEvent(h, "s", "s", kind, 50, T0 + timedelta(minutes=minute), False,
                            {"num_tokens": 50, "kind": kind})

    seq = [ev("A", 0, "document"), ev("B", 1, "document"), ev("A", 2, "document"),
           ev("C", 3, "detected"), ev("B", 4, "document")]
    # LRU (100 tokens): A, B miss; A hit; C evicts B; B misses
    assert replay_lru(seq, 100) == 50
    # the engine's SegmentCache, 8 blocks of 16 tokens (two 50-token segments):
    # value tiers never admit C (score below 0.6), so B survives and hits
    scorer = FixedScorer({"document": 0.7, "detected": 0.1})
    assert replay_policy(seq, 128, ValueTiers(scorer)) == 100
    # LRU admits C, which evicts B
    assert replay_policy(seq, 128, LRU()) == 50
    # an extended-tier entry expires 30 minutes after its last use
    late = [ev("A", 0, "document"), ev("A", 31, "document"), ev("A", 40, "document")]
    assert replay_policy(late, 128, ValueTiers(scorer)) == 50
    assert replay_lru(late, 100) == 100
