"""Stable-region detection from per-position attention entropy.

The torch engine reports, for every prompt position, the normalized entropy (0..1) of the
attention that position's query paid to its context. Text the model reads "locally" (boiler
plate, a template, a document it has no need to relate to what came before) attends narrowly
and has low entropy; such spans depend little on what precedes them and are the candidates for
reuse at another position. Contract of ``EntropyDetector.detect``:

1. Smooth: ``s[i]`` is the mean of the raw entropies over the trailing window
   ``[i - window + 1, i]`` (clipped at 0).
2. Start: a region starts at ``i`` when ``s[i], ..., s[i + start_run - 1]`` are all below
   ``threshold``.
3. Extend: the region then takes position ``p`` (from ``i + start_run`` on) while
   ``s[p], ..., s[p + extend_run - 1]`` all stay below ``extend_threshold`` (the look-ahead is
   clipped at the end of the prompt); it ends at the first ``p`` that fails.
4. Keep regions of at least ``min_length`` tokens; scanning resumes after the region's end.

Regions never overlap, are sorted, and lie within the prompt. Pure Python, no tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from suffixmem.engine.protocol import Segment
from suffixmem.errors import ConfigError


@dataclass(slots=True)
class DetectorConfig:
    """Validated thresholds. Entropies are normalized to [0, 1]; lengths count tokens.

    ``threshold`` (start) must not exceed ``extend_threshold``: a region is harder to start than
    to continue (hysteresis). ``min_length`` is 8-12 tokens: shorter spans are cheaper to
    recompute than to track.
    """

    window: int = 8  # trailing tokens averaged by the smoothing (step 1)
    threshold: float = 0.5  # a region starts below this smoothed entropy...
    start_run: int = 3  # ...for this many consecutive positions (step 2)
    extend_threshold: float = 0.75  # it extends while the look-ahead stays below this...
    extend_run: int = 5  # ...over this many positions (step 3)
    min_length: int = 10  # shorter regions are dropped (step 4)

    def __post_init__(self) -> None:
        for name in ("window", "start_run", "extend_run"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 < self.threshold <= self.extend_threshold <= 1.0:
            raise ConfigError(
                "need 0 < threshold <= extend_threshold <= 1, got "
                f"{self.threshold} and {self.extend_threshold}"
            )
        if isinstance(self.min_length, bool) or not 8 <= self.min_length <= 12:
            raise ConfigError(f"min_length must be 8-12 tokens, got {self.min_length!r}")
        if self.min_length < self.start_run:
            raise ConfigError("min_length must be >= start_run")


@dataclass(slots=True, frozen=True)
class Region:
    """A detected stable span ``[start, end)`` of prompt positions and its mean raw entropy."""

    start: int
    end: int
    mean_entropy: float

    def __len__(self) -> int:
        return self.end - self.start

    def to_segment(self, shared: bool = False) -> Segment:
        return Segment(self.start, self.end, kind="detected", shared=shared)


def smooth(entropy: Sequence[float], window: int) -> list[float]:
    """Trailing moving average: ``out[i] = mean(entropy[max(0, i - window + 1) : i + 1])``."""
    out: list[float] = []
    total = 0.0
    for i, e in enumerate(entropy):
        total += e
        if i >= window:
            total -= entropy[i - window]
        out.append(total / min(i + 1, window))
    return out


class EntropyDetector:
    """Finds stable regions in a prompt's attention-entropy profile (see the module contract)."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()

    def detect(self, entropy: Sequence[float]) -> list[Region]:
        """Stable regions of a prompt whose position ``i`` had normalized entropy
        ``entropy[i]``. Raises ``ValueError`` on values outside [0, 1]."""
        cfg = self.config
        values = [float(e) for e in entropy]
        for i, e in enumerate(values):
            if not 0.0 <= e <= 1.0:
                raise ValueError(f"entropy[{i}] = {e} lies outside [0, 1]")
        s = smooth(values, cfg.window)
        n = len(s)
        regions: list[Region] = []
        i = 0
        while i + cfg.start_run <= n:
            if not all(s[i + j] < cfg.threshold for j in range(cfg.start_run)):
                i += 1
                continue
            end = i + cfg.start_run
            while end < n and all(
                s[p] < cfg.extend_threshold for p in range(end, min(n, end + cfg.extend_run))
            ):
                end += 1
            if end - i >= cfg.min_length:
                regions.append(Region(i, end, sum(values[i:end]) / (end - i)))
            i = end
        return regions
