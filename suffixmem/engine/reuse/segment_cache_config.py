"""The segment cache's validated settings: lifetimes, value-tier thresholds, block budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

from suffixmem.errors import ConfigError
from suffixmem.retention import Tier

__all__ = ["SegmentCacheConfig"]


@dataclass(slots=True)
class SegmentCacheConfig:
    """Validated settings. Times in seconds, budget in blocks (``0`` = unlimited)."""

    session_ttl_s: float = 300.0
    extended_ttl_s: float = 1800.0
    pinned_threshold: float = 0.85
    cache_threshold: float = 0.6
    max_blocks: int = 0
    min_tokens: int = 8

    def __post_init__(self) -> None:
        if not self.session_ttl_s > 0:
            raise ConfigError(f"session_ttl_s must be > 0, got {self.session_ttl_s}")
        if not self.extended_ttl_s > 0:
            raise ConfigError(f"extended_ttl_s must be > 0, got {self.extended_ttl_s}")
        if not 0.0 <= self.cache_threshold <= self.pinned_threshold <= 1.0:
            raise ConfigError(
                "need 0 <= cache_threshold <= pinned_threshold <= 1, got "
                f"{self.cache_threshold} and {self.pinned_threshold}"
            )
        if self.max_blocks < 0:
            raise ConfigError(f"max_blocks must be >= 0 (0 = unlimited), got {self.max_blocks}")
        if self.min_tokens < 1:
            raise ConfigError(f"min_tokens must be >= 1, got {self.min_tokens}")

    def tier(self, score: float | None) -> Tier:
        """The tier of a segment with this value score (``None``: unscored)."""
        if score is None:
            return Tier.STANDARD
        if not 0.0 <= score <= 1.0 or math.isnan(score):
            raise ConfigError(f"value scores must lie in [0, 1], got {score}")
        if score >= self.pinned_threshold:
            return Tier.PINNED
        if score >= self.cache_threshold:
            return Tier.EXTENDED
        return Tier.NONE

    def ttl(self, tier: Tier) -> float:
        """Seconds an entry of ``tier`` lives after its last use (``inf`` when pinned)."""
        if tier is Tier.PINNED:
            return math.inf
        if tier is Tier.EXTENDED:
            return self.extended_ttl_s
        if tier is Tier.STANDARD:
            return self.session_ttl_s
        raise ValueError("segments of tier NONE are not cached")
