"""``suffixmem bench paired``: the report's arithmetic on hand-made records, and a tiny real run
on one vLLM engine (both arms, fresh salts per round, both arms' prompts agree)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from suffixmem_bench.chat.paired import run_paired, summarize
from suffixmem_bench.chat.workload import Workload


def _workload(sessions: int = 1, turns: int = 2) -> Workload:
    return Workload(name="default", system_prompt="You are brief.",
                    sessions=[[f"Question {t} of {s}?" for t in range(turns)]
                              for s in range(sessions)],
                    max_tokens=4)


def _rec(arm: str, rnd: int, turn: int, ttft: float, first: bool, prompt: int = 100,
         overhead: float | None = None) -> dict:
    return {"arm": arm, "round": rnd, "session": 0, "turn": turn, "first": first,
            "ttft_ms": ttft, "latency_ms": ttft + 100, "pre_engine_ms": 1.0,
            "engine_ttft_ms": ttft - 2,
            "prompt_tokens": prompt, "cached_tokens": 64, "output_tokens": 4,
            "manager_overhead_ms": overhead}


def test_summary_pairs_each_turn_with_the_other_arms_same_turn() -> None:
    records = []
    # round r, turn t: stock 100 ms; suffixmem 90 ms when it went first, 110 ms when second
    for r in range(3):
        for t in (1, 2):
            ours_first = (t + r) % 2 == 0
            records.append(_rec("stock", r, t, 100.0, not ours_first))
            records.append(_rec("suffixmem", r, t, 90.0 if ours_first else 110.0, ours_first,
                                prompt=100 if t == 1 else 101, overhead=0.5 + r))
    report = summarize(records, _workload(), 3, late_turn=2)
    paired = report["paired"]
    assert paired["turns"] == 3  # turn 2 of each round
    # turn 2: rounds 0 and 2 put suffixmem first (90 ms), round 1 second (110 ms)
    assert paired["ttft_ratio_p50"] == pytest.approx(0.9)
    assert paired["ttft_diff_ms_p50"] == pytest.approx(-10.0)
    assert paired["suffixmem_first"] == {"turns": 2, "ttft_ratio_p50": pytest.approx(0.9),
                                         "ttft_diff_ms_p50": pytest.approx(-10.0)}
    assert paired["stock_first"] == {"turns": 1, "ttft_ratio_p50": pytest.approx(1.1),
                                     "ttft_diff_ms_p50": pytest.approx(10.0)}
    assert paired["round_ratios"] == pytest.approx([0.9, 1.1, 0.9])
    assert report["target"]["limit"] == 1.03 and report["target"]["pass"] is True
    assert report["same_prompts"] == 0.5  # turn 2's prompts differ by a token
    ours = report["arms"]["suffixmem"]
    assert ours["manager_overhead_ms_p50"] == 1.5
    assert "manager_overhead_ms_p50" not in report["arms"]["stock"]
    assert report["arms"]["stock"]["ttft_p50_from_turn8_ms"]["median"] == 100.0
    slower = [dict(x, ttft_ms=104.0) if x["arm"] == "suffixmem" else x for x in records]
    assert summarize(slower, _workload(), 3, late_turn=2)["target"]["pass"] is False


def test_summary_without_late_turns_reports_nan_not_a_pass() -> None:
    records = [_rec("stock", r, 1, 100.0, True) for r in range(3)]
    records += [_rec("suffixmem", r, 1, 50.0, False) for r in range(3)]
    report = summarize(records, _workload(), 3)  # turn 8 never comes
    assert math.isnan(report["paired"]["ttft_ratio_p50"])
    assert report["target"]["pass"] is False


@pytest.mark.slow
@pytest.mark.vllm
def test_tiny_paired_run_on_one_engine(vllm_engine: Any) -> None:
    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.chat.peers import EngineOptions

    sessions, turns, repeats = 2, 3, 3
    workload = Workload(
        name="default",
        system_prompt="You are a helpful assistant who answers every question in one short "
                      "sentence. " * 6,
        sessions=[["What is a cat?", "And a dog?", "Which is bigger?"],
                  ["Name a colour.", "Another one?", "Why that one?"]],
        max_tokens=4)
    done: list[int] = []
    stream = vllm_engine.stream
    report, records = run_paired(workload, EngineOptions(model=DEFAULT_MODEL, max_tokens=4),
                                 repeats, progress=lambda d, _t: done.append(d), late_turn=2,
                                 engine=vllm_engine)
    assert vllm_engine.stream == stream  # every wrapper taken back: the engine is as it was
    assert len(records) == 2 * repeats * sessions * turns
    assert done[-1] == repeats * sessions * turns
    by_key = {(x["arm"], x["round"], x["session"], x["turn"]): x for x in records}
    for r in range(repeats):
        for s in range(sessions):
            # every round opens new sessions under new salts: its first turns hit nothing of
            # an earlier round's (whose system prompt filled whole blocks)
            assert by_key[("stock", r, s, 1)]["cached_tokens"] == 0
            assert by_key[("suffixmem", r, s, 1)]["cached_tokens"] == 0
            for t in (2, 3):  # later turns hit their own session's prefix in both arms
                assert by_key[("stock", r, s, t)]["cached_tokens"] > 0
                assert by_key[("suffixmem", r, s, t)]["cached_tokens"] > 0
    for x in records:
        assert 0 < x["pre_engine_ms"] < x["ttft_ms"]
        assert 0 < x["engine_ttft_ms"] <= x["ttft_ms"] - x["pre_engine_ms"]
        assert (x["manager_overhead_ms"] is None) == (x["arm"] == "stock")
    firsts = {(x["round"], x["session"], x["turn"]) for x in records
              if x["arm"] == "suffixmem" and x["first"]}
    assert 0 < len(firsts) < repeats * sessions * turns  # the order alternates
    assert report["same_prompts"] == 1.0  # a plain chat: both layouts send the same prompt
    assert report["paired"]["turns"] == repeats * sessions * 2
    assert math.isfinite(report["paired"]["ttft_ratio_p50"])
