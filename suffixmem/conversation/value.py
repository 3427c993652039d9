"""Learned segment value scoring from the manager's SQL log.

The tiers, the heuristic formula and the retention policies live in ``suffixmem.retention``
(one policy for the segment cache and the manager). This module adds the trained scorer:

``LearnedValueScorer`` is a scikit-learn gradient-boosted classifier over ``FEATURES`` (length,
hits so far, age, time since last sight, sessions seen, position, kind, token entropy, attention
entropy when known), trained by ``train_value_scorer`` from the sightings the manager logs in
SQL (``segment_events``): a sighting is a positive example when the same segment (same scope) is
seen again within ``horizon_s``. Sightings closer than ``horizon_s`` to the end of the log have
no known outcome yet and are left out.

Features are ``suffixmem.retention.SegmentFeatures`` (``ValueFeatures`` is the same class).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from suffixmem.retention import (
    KINDS,
    HeuristicValueScorer,
    SegmentFeatures,
    Tier,
    ValueScorer,
    segment_hash,
    tier_of,
    token_entropy,
)

__all__ = [  # the retention names are re-exported for the benchmarks that replay the log
    "FEATURES", "TTL_S", "HeuristicValueScorer", "LearnedValueScorer", "Sighting", "Tier",
    "ValueFeatures", "ValueScorer", "feature_vector", "label_sightings", "segment_hash",
    "tier_of", "token_entropy", "train_value_scorer",
]

TTL_S = 30 * 60.0

ValueFeatures = SegmentFeatures  # the features the manager logs are the cache's


FEATURES = ("log_tokens", "seen", "log_age", "log_since_last", "sessions_seen", "shared",
            "rel_position", "token_entropy", "mean_entropy", *(f"kind_{k}" for k in KINDS))


def feature_vector(f: Any) -> list[float]:
    """``FEATURES`` of any object with ``ValueFeatures``' attribute names."""
    g = lambda name, default: getattr(f, name, default)  # noqa: E731
    prompt = max(1, int(g("prompt_tokens", 0) or 0))
    ent = g("mean_entropy", None)
    kind = g("kind", "document")
    return [
        math.log1p(int(g("num_tokens", 0))), float(min(int(g("seen", 0)), 20)),
        math.log1p(float(g("age_s", 0.0))), math.log1p(float(g("since_last_s", 0.0))),
        float(min(int(g("sessions_seen", 1)), 20)), float(bool(g("shared", False))),
        min(1.0, int(g("position", 0)) / prompt), float(g("token_entropy", 0.0)),
        -1.0 if ent is None else float(ent),
        *(float(kind == k) for k in KINDS),
    ]


class LearnedValueScorer:
    """A fitted scikit-learn classifier; the score is its probability of reuse."""

    def __init__(self, model: Any, samples: int, positives: int) -> None:
        self.model = model
        self.samples = samples
        self.positives = positives

    def score(self, features: Any) -> float:
        p = self.model.predict_proba(np.asarray([feature_vector(features)]))[0, 1]
        return float(p)

    def score_many(self, features: Sequence[Any]) -> list[float]:
        """``score`` of many segments in one call (one model evaluation)."""
        if not features:
            return []
        probs = self.model.predict_proba(np.asarray([feature_vector(f) for f in features]))
        return [float(p) for p in probs[:, 1]]

    def tier(self, score: float) -> Tier:
        return tier_of(score)



@dataclass(slots=True, frozen=True)
class Sighting:
    """One logged sighting (the store's ``SegmentEvent`` has these fields)."""

    hash: str
    scope: str
    seen_at: datetime
    features: Mapping[str, Any]


def label_sightings(
    events: Sequence[Any], horizon_s: float = TTL_S,
) -> tuple[list[list[float]], list[int]]:
    """(X, y): features of each sighting and whether the same segment came back within
    ``horizon_s``; sightings whose outcome is not known yet (too close to the log's end)
    are dropped."""
    if not events:
        return [], []
    end = max(e.seen_at for e in events)
    by_key: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for e in events:
        by_key[(e.hash, e.scope)].append(e)
    xs: list[list[float]] = []
    ys: list[int] = []
    for group in by_key.values():
        group.sort(key=lambda e: e.seen_at)
        for i, e in enumerate(group):
            nxt = group[i + 1].seen_at if i + 1 < len(group) else None
            back = nxt is not None and (nxt - e.seen_at).total_seconds() <= horizon_s
            if not back and (end - e.seen_at).total_seconds() < horizon_s:
                continue  # censored: it may still come back
            xs.append(feature_vector(ValueFeatures.from_dict(e.features)))
            ys.append(int(back))
    return xs, ys


def train_value_scorer(
    events: Sequence[Any], horizon_s: float = TTL_S, min_samples: int = 200,
) -> ValueScorer:
    """A ``LearnedValueScorer`` fitted on logged sightings, or the heuristic when there are
    fewer than ``min_samples`` labelled ones or only one outcome."""
    xs, ys = label_sightings(events, horizon_s)
    if len(xs) < min_samples or len(set(ys)) < 2:
        return HeuristicValueScorer()
    from sklearn.ensemble import HistGradientBoostingClassifier

    model = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.1, random_state=0)
    model.fit(np.asarray(xs), np.asarray(ys))
    return LearnedValueScorer(model, len(xs), int(sum(ys)))
