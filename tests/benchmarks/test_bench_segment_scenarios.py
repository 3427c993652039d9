"""``bench segments`` scenarios (suffixmem_bench/segment_scenarios.py) and issue 14's workload
modules (suffixmem_bench/workloads/)."""

from __future__ import annotations

import dataclasses

import pytest

from suffixmem_bench import segment_scenarios as sc
from suffixmem_bench.workloads import WORKLOADS, from_turn, get, ttft_vs_direct


@pytest.fixture(scope="module")
def encode(tokenizer):  # type: ignore[no-untyped-def]
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("scenario", sc.SCENARIOS)
def test_scenarios_cache_the_same_tokens_the_prompt_reuses(encode, scenario) -> None:  # type: ignore[no-untyped-def]
    prompts = sc.build_scenario(encode, scenario, count=2, segment_tokens=60, seed=1)
    same_eval = sc.build_scenario(encode, "same_context", count=2, segment_tokens=60, seed=1)
    for p, q in zip(prompts, same_eval, strict=True):
        assert p.ids == q.ids and p.spans == q.spans  # one evaluated prompt for all scenarios
        for (a, b), (fi, fs) in zip(p.spans, p.origin, strict=True):
            fill = p.fills[fi][0]
            assert fill[fs:fs + b - a] == p.ids[a:b]
            assert fs != a or scenario == "same_context"  # the segments moved
    if scenario == "independent":
        assert len(prompts[0].fills) == 2 and prompts[0].origin[0][1] == prompts[0].origin[1][1]
    if scenario == "reordered":
        assert prompts[0].origin[1][1] < prompts[0].origin[0][1]  # document 2 came first


@pytest.mark.slow
def test_scenario_quality_is_exact_when_nothing_moves(encode, fp32_llama) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.engine.reuse.blend import BlendConfig

    p = sc.build_scenario(encode, "independent", count=1, segment_tokens=60, seed=3)[0]
    same = dataclasses.replace(p, fills=((p.ids, p.spans),), origin=tuple((0, a)
                                                                        for a, _ in p.spans))
    exact = sc.scenario_quality(fp32_llama, [same], BlendConfig(first_k=0), continuation=8)
    assert exact["mean_kl"] < 1e-6 and exact["top1_agreement"] == 1.0
    moved = sc.scenario_quality(fp32_llama, [p], BlendConfig(first_k=0), continuation=8)
    assert moved["mean_kl"] > 1e-4


def test_workload_modules_build_their_pinned_shapes(encode) -> None:  # type: ignore[no-untyped-def]
    count = lambda text: len(encode(text))  # noqa: E731
    with pytest.raises(ValueError, match="unknown workload"):
        get("everything")
    for name in WORKLOADS:
        mod = get(name)
        w = mod.build(count, sessions=2, turns=3)
        assert w.name == name and w.num_sessions == 2 and w.num_turns == 3
    shared = get("shared").build(count, sessions=2, turns=2)
    assert 1300 <= shared.system_tokens <= 1600  # ~1,500-token public system prompt
    assert get("overflow").ENGINE_OPTIONS["max_model_len"] == 2048
    rag = get("rag").build(count, sessions=2, turns=3)
    assert len(rag.passages) == 60 and len(rag.turn_systems[0]) == 3
    assert rag.turn_systems[0][0] != rag.turn_systems[0][1]  # the passages change every turn


def test_targets_compare_with_vllm_direct() -> None:
    direct = {"status": "ok", "ttft_p50_s": 0.3,
              "by_turn": {"turn": [1, 2, 3], "ttft_p50_s": [1.0, 0.2, 0.1]}}
    fast = {"status": "ok", "ttft_p50_s": 0.09,
            "by_turn": {"turn": [1, 2, 3], "ttft_p50_s": [1.0, 0.16, 0.1]}}
    slow = {**fast, "ttft_p50_s": 0.2}
    t = ttft_vs_direct({"vllm_direct": direct, "suffixmem_a": fast, "suffixmem_b": slow},
                       "x", "rule", lambda f: f["ttft_p50_s"], 1 / 3)["x"]
    assert t["passed"] is True  # one capability configuration meets it
    assert t["configs"]["suffixmem_b"]["passed"] is False
    assert from_turn(direct, 2) == pytest.approx(0.15)
    assert ttft_vs_direct({"suffixmem_a": fast}, "x", "r", lambda f: 0.0, 1.0)["x"]["passed"] \
        is None
