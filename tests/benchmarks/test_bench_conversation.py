"""The three conversation benches run end to end (small sizes) and report what they claim."""

from __future__ import annotations

from typing import Any

import pytest

from suffixmem_bench.retention import run_retention


def test_retention_bench_small() -> None:
    r = run_retention(budget=4_000, seed=2, sessions=80)
    assert {"value_tokens_saved", "lru_tokens_saved"} <= set(r)
    assert 0 < r["lru_tokens_saved"] <= r["replayed_tokens"]
    assert 0 < r["value_tokens_saved"] <= r["replayed_tokens"]
    assert [row["budget_tokens"] for row in r["sweep"]] == [3_000, 5_000, 10_000, 20_000, 40_000]
    lru = [row["lru_tokens_saved"] for row in r["sweep"]]
    assert lru == sorted(lru)  # LRU never saves less with more room


@pytest.mark.slow
@pytest.mark.vllm
def test_layout_bench_on_vllm(vllm_engine: Any) -> None:
    from suffixmem_bench.layout import run_layout

    r = run_layout(turns=14, context_window=448, max_tokens=24, engine=vllm_engine)
    assert r["suffixmem_evictions"] >= 1 and r["sliding_window_evictions"] >= 1
    assert r["suffixmem_evictions"] < r["sliding_window_evictions"]
    assert 0.0 <= r["sliding_window_hit_rate"] < r["suffixmem_hit_rate"] <= 1.0
