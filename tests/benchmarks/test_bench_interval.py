"""Prediction intervals for a rerun's figure (``suffixmem_bench.interval``): kinds, the pooled
drift, coverage on simulated runs, and how a figure's range is widened."""

from __future__ import annotations

import math
import random

import pytest

from suffixmem_bench.interval import Drift, drift, kind, predict, widen


@pytest.mark.parametrize(("name", "expected"), [
    ("same_engine.suffixmem_vllm_app.round_ratio.ttft_p50_from_turn8", "paired"),
    ("same_engine.suffixmem_vllm.round_ratio.output_tok_s", "paired"),
    ("configs.suffixmem_torch.ttft_p50_from_turn8_vs_vllm_direct_salted", "ratio"),
    ("throughput_ratio", "ratio"),
    ("targets.decode_speedup_vs_transformers", "ratio"),
    ("targets.decode_over_bandwidth_limit", "ratio"),
    ("configs.vllm_direct.output_tok_s", "throughput"),
    ("suffixmem.throughput_tok_s", "throughput"),
    ("configs.vllm_direct.ttft_p50_from_turn8_s", "time"),
    ("engines.torch.decode_ms_per_token", "time"),
    ("configs.suffixmem_vllm.manager_overhead_ms_p50", "time"),
    ("engines.torch.prefill_s", "time"),
    ("affinity.hit_rate_of_ceiling", "other"),
    ("failover.lost_turns", "other"),
])
def test_each_figure_has_a_kind(name: str, expected: str) -> None:
    assert kind(name) == expected


def test_drift_pools_log_deviations_by_kind_and_skips_what_the_model_does_not_fit() -> None:
    rows = [
        {"a.ttft_s": [1.0, math.exp(0.2)],            # logs 0, 0.2: 0.02 squared, 1 dof
         "a.tok_s": [100.0, 100.0, 100.0],           # 0 squared, 2 dof
         "a.hits": [3.0, 5.0]},                       # other: not a timing
        {"b.ttft_s": [2.0, 2.0 * math.exp(0.4), 2.0 * math.exp(0.2)],  # 0.08, 2 dof
         "b.overhead_ms": [0.0, 1.0],                 # not positive: left out
         "b.prefill_s": [1.0]},                       # one run: nothing to pool
    ]
    out = drift(rows)
    assert set(out) == {"time", "throughput"}
    assert out["time"].dof == 3 and out["time"].sigma == pytest.approx(math.sqrt(0.10 / 3))
    assert out["throughput"] == Drift(0.0, 2)


def test_a_99_percent_interval_holds_99_of_100_simulated_reruns() -> None:
    """Runs whose log varies around a figure's own mean with one σ per kind: the interval
    from 3 runs and a σ pooled over 20 figures holds the next run at its nominal rate."""
    rng = random.Random(7)
    sigma, trials, inside = 0.12, 3000, 0
    for _ in range(trials):
        means = [rng.uniform(-3, 3) for _ in range(20)]
        rows = {f"f{i}.ttft_s": [math.exp(m + rng.gauss(0, sigma)) for _ in range(3)]
                for i, m in enumerate(means)}
        lo, hi = predict(rows["f0.ttft_s"], drift([rows])["time"], 0.99)
        inside += lo <= math.exp(means[0] + rng.gauss(0, sigma)) <= hi
    assert 0.98 <= inside / trials <= 0.997
    # at 80% it is narrower and holds about 80%
    lo99, hi99 = predict([1.0, 1.1, 1.2], Drift(0.1, 40), 0.99)
    lo80, hi80 = predict([1.0, 1.1, 1.2], Drift(0.1, 40), 0.80)
    assert lo99 < lo80 < 1.1 < hi80 < hi99


def test_widen_joins_the_rounds_range_to_the_prediction_and_leaves_agreeing_runs() -> None:
    drifts = {"time": Drift(0.1, 50)}
    lo, hi = predict([0.030, 0.033], drifts["time"])
    assert widen((0.031, 0.029, 0.034), "x.ttft_s", [0.030, 0.033], drifts) == (0.031, lo, hi)
    # a round outside the prediction stays visible
    assert widen((0.031, 0.010, 0.034), "x.ttft_s", [0.030, 0.033], drifts)[1] == 0.010
    figure = (40.0, 40.0, 40.0)
    assert widen(figure, "x.ttft_s", [40.0, 40.0, 40.0], drifts) == figure  # runs agree
    assert widen(figure, "x.hits", [39.0, 41.0], drifts) == figure          # no drift of kind
    assert widen(figure, "x.ttft_s", [0.0, 41.0], drifts) == figure         # not positive
