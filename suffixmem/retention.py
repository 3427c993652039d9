"""The one segment retention policy, shared by the engine's segment cache and the manager's
segment log. Imports neither torch nor vLLM (nor numpy): pure bookkeeping.

A ``RetentionPolicy`` is a strategy object behind one method, ``decide(features) -> Decision``:
the ``Tier`` a segment offered to the cache gets (and the value score behind it, if any).

- ``LRU``: every segment is kept for the standard TTL, evicted least recently used first.
- ``PinnedLRU`` (**the default**): shared segments (a system prompt many sessions start with)
  are pinned, everything else is LRU. A reviewer's replay (issue 10) found it saves more tokens
  than the value tiers at every cache budget, so it is the default until measured otherwise.
- ``SecondHit``: admission on the second sighting only (a segment seen once is not cached),
  then another policy decides.
- ``ValueTiers``: a ``ValueScorer``'s score picks the tier: ``>= pinned_threshold`` (0.85)
  pinned, ``>= cache_threshold`` (0.6) extended TTL, below: not cached.

``HeuristicValueScorer`` is the documented scoring formula (``score`` in [0, 1]):

    score = base[kind] + (0.10 if seen >= 1) + 0.05 * min(seen - 1, 2)   # recurrence
            + 0.10 * min(sessions_seen - 1, 3) / 3                     # spread
            - 0.20 if num_tokens < 16                                  # cheap to recompute

with ``base`` = system_tail 0.9, json_schema 0.85, template/anchor 0.75, document 0.55,
detected 0.5. (The learned scorer, trained from the manager's SQL log, lives in
``suffixmem.conversation.value``.)
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Protocol, runtime_checkable

KINDS = ("system_tail", "template", "json_schema", "document", "anchor", "detected")
"""Every ``Segment.kind``, in one place."""

PINNED_THRESHOLD = 0.85
CACHE_THRESHOLD = 0.6


class Tier(Enum):
    """How long a segment is kept."""

    PINNED = "pinned"  # no expiry; evicted for space only when no other entry is left
    EXTENDED = "extended"  # the extended TTL after last use
    STANDARD = "standard"  # the standard (session) TTL after last use
    NONE = "none"  # not cached


@dataclass(slots=True, frozen=True)
class Decision:
    tier: Tier
    score: float | None = None


@dataclass(slots=True, frozen=True)
class SegmentFeatures:
    """What a policy sees about a segment when it is offered to the cache.

    ``seen``: earlier sightings in its scope; ``sessions_seen``: distinct sessions that used it;
    ``age_s`` / ``since_last_s``: seconds since first / previous sighting; ``position``: start
    offset in the prompt; ``token_entropy``: of the span's token histogram; ``mean_entropy``:
    attention entropy when the engine measured it (else None)."""

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
    def from_dict(cls, d: Mapping[str, Any]) -> SegmentFeatures:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def segment_hash(token_ids: Sequence[int]) -> str:
    """Hex BLAKE2b-128 of a span's token ids (its scope is kept beside it)."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=16).hexdigest()


def token_entropy(token_ids: Sequence[int]) -> float:
    """Shannon entropy (bits) of the span's token-id histogram over log2(length): near 1 for
    varied text, low for repetitive spans."""
    n = len(token_ids)
    if n < 2:
        return 0.0
    h = -sum(c / n * math.log2(c / n) for c in Counter(token_ids).values())
    return h / math.log2(n)


def tier_of(score: float, pinned_threshold: float = PINNED_THRESHOLD,
            cache_threshold: float = CACHE_THRESHOLD) -> Tier:
    """The value tier of a score: pinned, extended TTL, or not cached."""
    if not 0.0 <= score <= 1.0 or math.isnan(score):
        from suffixmem.errors import ConfigError

        raise ConfigError(f"value scores must lie in [0, 1], got {score}")
    if score >= pinned_threshold:
        return Tier.PINNED
    if score >= cache_threshold:
        return Tier.EXTENDED
    return Tier.NONE


@runtime_checkable
class ValueScorer(Protocol):
    """Rates a segment's worth of caching in [0, 1]."""

    def score(self, features: SegmentFeatures) -> float: ...


@runtime_checkable
class RetentionPolicy(Protocol):
    """Decides a segment's tier."""

    def decide(self, features: SegmentFeatures) -> Decision: ...


class HeuristicValueScorer:
    """The documented formula (module docstring)."""

    BASE: Mapping[str, float] = {
        "system_tail": 0.9, "json_schema": 0.85, "template": 0.75, "anchor": 0.75,
        "document": 0.55, "detected": 0.5,
    }

    def score(self, features: SegmentFeatures) -> float:
        s = self.BASE.get(features.kind, 0.5)
        if features.seen >= 1:
            s += 0.10 + 0.05 * min(features.seen - 1, 2)
        s += 0.10 * min(max(features.sessions_seen - 1, 0), 3) / 3
        if features.num_tokens < 16:
            s -= 0.2
        return min(1.0, max(0.0, s))

    def tier(self, score: float) -> Tier:
        return tier_of(score)


class LRU:
    def decide(self, features: SegmentFeatures) -> Decision:
        return Decision(Tier.STANDARD)


class PinnedLRU:
    """Shared segments pinned, the rest LRU (the default)."""

    def decide(self, features: SegmentFeatures) -> Decision:
        return Decision(Tier.PINNED if features.shared else Tier.STANDARD)


class SecondHit:
    """Admit a segment from its second sighting on; ``then`` decides admitted ones."""

    def __init__(self, then: RetentionPolicy | None = None) -> None:
        self.then = then or LRU()

    def decide(self, features: SegmentFeatures) -> Decision:
        if features.seen < 1:
            return Decision(Tier.NONE)
        return self.then.decide(features)


class ValueTiers:
    """A scorer's value picks the tier (module docstring)."""

    def __init__(self, scorer: ValueScorer | None = None,
                 pinned_threshold: float = PINNED_THRESHOLD,
                 cache_threshold: float = CACHE_THRESHOLD) -> None:
        if not 0.0 <= cache_threshold <= pinned_threshold <= 1.0:
            from suffixmem.errors import ConfigError

            raise ConfigError(
                "need 0 <= cache_threshold <= pinned_threshold <= 1, got "
                f"{cache_threshold} and {pinned_threshold}")
        self.scorer = scorer or HeuristicValueScorer()
        self.pinned_threshold = pinned_threshold
        self.cache_threshold = cache_threshold

    def tier(self, score: float) -> Tier:
        return tier_of(score, self.pinned_threshold, self.cache_threshold)

    def decide(self, features: SegmentFeatures) -> Decision:
        score = float(self.scorer.score(features))
        return Decision(self.tier(score), score)


POLICIES: Mapping[str, type] = {
    "lru": LRU, "pinned-lru": PinnedLRU, "second-hit": SecondHit, "value": ValueTiers,
}


def make_policy(name: str = "pinned-lru") -> RetentionPolicy:
    """A policy by name (one of ``POLICIES``)."""
    try:
        return POLICIES[name]()  # type: ignore[no-any-return]
    except KeyError:
        from suffixmem.errors import ConfigError

        raise ConfigError(
            f"unknown retention policy {name!r}; expected one of {sorted(POLICIES)}") from None
