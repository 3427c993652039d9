"""Segment value scoring: which reusable prompt spans are worth keeping in the cache, how long.

A ``ValueScorer`` is a one-method strategy: ``score(features) -> float`` in ``[0, 1]``, the
estimated probability that the segment is used again soon. ``tier(score)`` maps it to a
retention tier:

- ``>= 0.85``: **pinned** (kept, never evicted for space while other tiers can go);
- ``0.6 - 0.85``: kept for a **30-minute TTL** after its last use;
- ``< 0.6``: **not cached**.

``HeuristicValueScorer`` is the documented fallback used until enough outcomes are logged:

    score = base[kind] + (0.10 if seen >= 1) + 0.05 * min(seen - 1, 2)   # recurrence
            + 0.10 * min(sessions_seen - 1, 3) / 3                     # spread
            - 0.20 if num_tokens < 16                                  # cheap to recompute

with ``base`` = system_tail 0.9, json_schema 0.85, template/anchor 0.75, document 0.55,
detected 0.5. A document seen once is not cached; seen again (or in another session) it is.

``LearnedValueScorer`` is a scikit-learn gradient-boosted classifier over ``FEATURES`` (length,
hits so far, age, time since last sight, sessions seen, position, kind, token entropy, attention
entropy when known), trained by ``train_value_scorer`` from the sightings the manager logs in
SQL (``segment_events``): a sighting is a positive example when the same segment (same scope) is
seen again within ``horizon_s``. Sightings closer than ``horizon_s`` to the end of the log have
no known outcome yet and are left out.

Features are read by attribute name with defaults, so the segment cache's own
``SegmentFeatures`` (num_tokens, kind, shared, seen, position, prompt_tokens, mean_entropy) can be
scored directly.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import numpy as np

PINNED_THRESHOLD = 0.85
CACHE_THRESHOLD = 0.6
TTL_S = 30 * 60.0
KINDS = ("system_tail", "template", "json_schema", "document", "anchor", "detected")


class Tier(Enum):
    PINNED = "pinned"
    TTL = "ttl"
    NONE = "none"


def tier_of(score: float) -> Tier:
    """The retention tier of a value score (see the module docstring)."""
    if score >= PINNED_THRESHOLD:
        return Tier.PINNED
    if score >= CACHE_THRESHOLD:
        return Tier.TTL
    return Tier.NONE


def segment_hash(token_ids: Sequence[int]) -> str:
    """Hex BLAKE2b-128 of a span's token ids (the scope is stored beside it)."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).hexdigest()


def token_entropy(token_ids: Sequence[int]) -> float:
    """Shannon entropy (bits) of the span's token-id histogram, divided by log2(length):
    near 1 for varied text, low for repetitive spans."""
    n = len(token_ids)
    if n < 2:
        return 0.0
    counts = Counter(token_ids).values()
    h = -sum(c / n * math.log2(c / n) for c in counts)
    return h / math.log2(n)


@dataclass(slots=True, frozen=True)
class ValueFeatures:
    """What a scorer sees about a segment at the moment it is offered to the cache.

    ``seen``: earlier sightings in its scope; ``sessions_seen``: distinct sessions that used it;
    ``age_s``: seconds since first seen; ``since_last_s``: since the previous sighting (0 when
    first); ``position``: start offset in the prompt; ``mean_entropy``: attention entropy when
    the engine measured it (else None)."""

    num_tokens: int
    kind: str = "document"
    shared: bool = False
    seen: int = 0
    position: int = 0
    prompt_tokens: int = 0
    age_s: float = 0.0
    since_last_s: float = 0.0
    sessions_seen: int = 1
    token_entropy: float = 0.0
    mean_entropy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValueFeatures:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


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


@runtime_checkable
class ValueScorer(Protocol):
    """Rates a segment's worth of caching in [0, 1]; ``tier`` maps a score to a tier."""

    def score(self, features: Any) -> float: ...

    def tier(self, score: float) -> Tier: ...


class HeuristicValueScorer:
    """The fallback formula (module docstring)."""

    BASE: Mapping[str, float] = {
        "system_tail": 0.9, "json_schema": 0.85, "template": 0.75, "anchor": 0.75,
        "document": 0.55, "detected": 0.5,
    }

    def score(self, features: Any) -> float:
        s = self.BASE.get(getattr(features, "kind", "document"), 0.5)
        seen = int(getattr(features, "seen", 0))
        if seen >= 1:
            s += 0.10 + 0.05 * min(seen - 1, 2)
        s += 0.10 * min(max(int(getattr(features, "sessions_seen", 1)) - 1, 0), 3) / 3
        if int(getattr(features, "num_tokens", 0)) < 16:
            s -= 0.2
        return min(1.0, max(0.0, s))

    def tier(self, score: float) -> Tier:
        return tier_of(score)

    def score_many(self, features: Sequence[Any]) -> list[float]:
        return [self.score(f) for f in features]


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
