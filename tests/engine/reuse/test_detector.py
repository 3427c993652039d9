"""The attention-entropy detector: smoothing, start and extension rules, validation."""

from __future__ import annotations

import pytest

from suffixmem.engine.reuse.detector import DetectorConfig, EntropyDetector, Region, smooth
from suffixmem.errors import ConfigError

HI, LO, MID = 0.9, 0.2, 0.6


def detect(values: list[float], **cfg: object) -> list[tuple[int, int]]:
    return [(r.start, r.end) for r in EntropyDetector(DetectorConfig(**cfg)).detect(values)]


def test_smooth_is_a_trailing_mean() -> None:
    assert smooth([1.0, 0.0, 1.0, 0.0], 2) == [1.0, 0.5, 0.5, 0.5]
    assert smooth([0.3, 0.6, 0.9], 8) == pytest.approx([0.3, 0.45, 0.6])
    assert smooth([], 8) == []


def test_region_starts_on_three_low_and_ends_before_a_high_run() -> None:
    # window 1: the raw values are the smoothed ones
    values = [HI] * 5 + [LO] * 15 + [HI] * 10
    # extension look-ahead of 5: position p joins while p..p+4 are all low, so the region
    # stops 4 positions before the first high one
    assert detect(values, window=1) == [(5, 16)]


def test_mid_values_extend_but_do_not_start() -> None:
    values = [HI] * 3 + [LO] * 3 + [MID] * 20 + [HI] * 6
    assert detect(values, window=1) == [(3, 22)]
    assert detect([HI] * 3 + [MID] * 30, window=1) == []  # never below the start threshold


def test_two_low_positions_do_not_start_a_region() -> None:
    values = ([HI] * 3 + [LO] * 2) * 6
    assert detect(values, window=1, threshold=0.5) == []


def test_region_runs_to_the_end_of_the_prompt() -> None:
    values = [HI] * 4 + [LO] * 12
    assert detect(values, window=1) == [(4, 16)]


def test_min_length_filters_short_regions() -> None:
    values = [HI] * 4 + [LO] * 13 + [HI] * 8  # a 9-token region (13 low, minus 4 look-ahead)
    assert detect(values, window=1, min_length=9) == [(4, 13)]
    assert detect(values, window=1, min_length=10) == []


def test_several_regions_do_not_overlap() -> None:
    block = [HI] * 6 + [LO] * 16
    regions = detect(block * 3 + [HI] * 6, window=1)
    assert regions == [(6, 18), (28, 40), (50, 62)]


def test_window_smooths_isolated_spikes() -> None:
    values = [HI] * 8 + [LO] * 10 + [1.0] + [LO] * 10 + [HI] * 16
    # unsmoothed, the spike breaks the region; with a window of 8 it survives
    assert detect(values, window=1) == []  # two 10-low runs: 6 tokens each after look-ahead
    smoothed = detect(values, window=8)
    assert len(smoothed) == 1
    start, end = smoothed[0]
    assert start < 18 < 19 < end


def test_region_reports_its_mean_raw_entropy() -> None:
    values = [HI] * 3 + [0.1, 0.3] * 8
    (region,) = EntropyDetector(DetectorConfig(window=1)).detect(values)
    assert isinstance(region, Region)
    assert region.mean_entropy == pytest.approx(sum(values[3:]) / 16)
    seg = region.to_segment()
    assert (seg.start, seg.end, seg.kind) == (3, 19, "detected")


def test_entropies_must_be_normalized() -> None:
    with pytest.raises(ValueError, match="outside"):
        EntropyDetector().detect([0.1, 1.2])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": 0},
        {"start_run": 0},
        {"extend_run": -1},
        {"window": 2.5},
        {"threshold": 0.0},
        {"threshold": 0.8, "extend_threshold": 0.75},
        {"extend_threshold": 1.1},
        {"min_length": 7},
        {"min_length": 13},
    ],
)
def test_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        DetectorConfig(**kwargs)
