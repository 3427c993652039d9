"""``suffixmem bench engines``: its cost model and one short run through the torch engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from suffixmem.config import EngineConfig
from suffixmem_bench.engines import measure_limits, model_costs, run_engines


def test_cost_model_agrees_with_the_loaded_model(model_path: Path, fp32_llama: Any) -> None:
    costs = model_costs(model_path, 100)
    c = fp32_llama.config
    kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 100 * 2  # bf16 bytes
    # the weights a decode step reads, counted by the model itself (bf16 = half of fp32)
    assert costs["decode_bytes_per_token"] == fp32_llama.weight_bytes // 2 + kv
    attn = sum(4 * c.num_heads * c.head_dim * (t + 1) * c.num_layers for t in range(100))
    matmuls = 100 * fp32_llama.flops_per_token(0)
    assert costs["prefill_flops"] == matmuls + attn + 2 * c.hidden_size * c.vocab_size


def test_measure_limits_reports_positive_rates() -> None:
    lim = measure_limits(size=256, copy_mib=8, repeats=2)
    assert lim["matmul_flops_per_s"] > 1e8 and lim["matmul_dtype"] == EngineConfig().dtype
    assert lim["copy_bytes_per_s"] > 1e8
    assert lim["threads"] == torch.get_num_threads()


@pytest.mark.slow
def test_run_engines_torch_only_interleaved_at_two_thread_counts() -> None:
    out = run_engines(prompt_tokens=300, decode_tokens=4, engines=("torch",), repeats=3,
                      threads=(1, 2), limit_steps=2)
    t = out["engines"]["torch"]
    assert out["threads"] == [1, 2] and out["repeats"] == 3
    assert set(out["by_threads"]) == {"1", "2"} and out["by_threads"]["2"]["torch"] is t
    assert out["prompt_tokens"] == t["prompt_tokens"] > 200
    # cold is a fresh session (nothing cached); warm hits every full block but the last token
    assert t["cold_cached_tokens"] == 0
    assert t["warm_cached_tokens"] == (out["prompt_tokens"] - 1) // 16 * 16
    for key in ("prefill_s", "warm_ttft_s", "decode_ms_per_token"):
        runs = t[f"{key}_runs"]
        assert len(runs) == 3 and t[f"{key}_min"] <= t[key] <= t[f"{key}_max"]
        assert t[key] == sorted(runs)[1]
    assert t["prefill_flops_fraction"] > 0 and t["decode_bandwidth_fraction"] > 0
    lim = out["limits"]
    assert lim["bandwidth_limit_ms"] == pytest.approx(
        lim["weights_bytes"] / lim["copy_bytes_per_s"] * 1e3)
    assert lim["runner_decode_ms_per_token_b1"] > lim["bandwidth_limit_ms"]
    assert lim["runner_ratio_b4"] > 0
    assert set(lim["runner_by_threads"]) == {"1", "2"}
    assert lim["runner_by_threads"]["2"]["runner_ratio_b1"] == lim["runner_ratio_b1"]
    assert lim["runner_by_threads"]["1"]["runner_decode_ms_per_token_b1"] > 0
    assert out["targets"]["warm_over_cold"] == t["warm_ttft_s"] / t["prefill_s"]
    assert isinstance(out["noisy"], bool) and out["commit"]
    assert out["matmul_gflops"]["before"] > 0 and len(out["load_avg"]["after"]) == 3
    with pytest.raises(Exception, match="unknown engines"):
        run_engines(engines=("nope",))
    with pytest.raises(ValueError, match="repeats must be"):
        run_engines(engines=("torch",), repeats=2)
