"""``suffixmem bench paired``: the report's arithmetic on hand-made records, and a tiny real run
on one vLLM engine (both arms, fresh salts per round, both arms' prompts agree)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from suffixmem_bench.chat.paired import run_paired
from suffixmem_bench.chat.paired_report import summarize
from suffixmem_bench.chat.workload import Workload


def _workload(sessions: int = 1, turns: int = 2) -> Workload:
    return Workload(name="default", system_prompt="You are brief.",
                    sessions=[[f"Question {t} of {s}?" for t in range(turns)]
                              for s in range(sessions)],
                    max_tokens=4)


def _rec(arm: str, rnd: int, turn: int, ttft: float, first: bool, prompt: int = 100,
         overhead: float | None = None, busy: float | None = None) -> dict:
    return {"arm": arm, "round": rnd, "session": 0, "turn": turn, "first": first,
            "ttft_ms": ttft, "latency_ms": ttft + 100, "pre_engine_ms": 1.0,
            "busy_ms": ttft + 100 if busy is None else busy,
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


def test_throughput_counts_each_arms_busy_time_per_round_and_pooled() -> None:
    records = []
    # 4 output tokens a turn; stock busy 200 ms a turn (20 tok/s); suffixmem 200 ms in rounds
    # 0 and 1, 250 ms in round 2 (its flush or waves took longer)
    for r in range(3):
        for t in (1, 2):
            records.append(_rec("stock", r, t, 100.0, True, busy=200.0))
            records.append(_rec("suffixmem", r, t, 100.0, False,
                                busy=250.0 if r == 2 else 200.0))
    report = summarize(records, _workload(), 3, late_turn=2, concurrent=True)
    assert report["workload"]["mode"] == "concurrent"
    assert report["arms"]["stock"]["output_tok_s"]["runs"] == pytest.approx([20.0] * 3)
    assert report["arms"]["suffixmem"]["output_tok_s"]["runs"] == pytest.approx([20, 20, 16])
    assert report["arms"]["suffixmem"]["output_tokens"] == 24
    paired = report["paired"]
    assert paired["throughput_round_ratios"] == pytest.approx([1.0, 1.0, 0.8])
    spread = paired["round_ratio"]["output_tok_s"]
    assert (spread["median"], spread["min"], spread["max"]) == pytest.approx((1.0, 0.8, 1.0))
    # pooled: 24 tokens in 1,300 ms against 24 in 1,200 ms
    assert paired["throughput_ratio"] == pytest.approx(1200 / 1300)
    target = report["throughput_target"]
    assert target["limit"] == 0.97 and target["pass"] is False
    faster = [dict(x, busy_ms=200.0) for x in records]
    assert summarize(faster, _workload(), 3, late_turn=2)["throughput_target"]["pass"] is True


def test_concurrent_summary_pairs_waves_by_their_median_not_sessions() -> None:
    records = []
    # each wave: one session runs its step alone (50 ms), the others queue (150 ms); which one
    # drew the first place differs between the arms, so session by session the ratios are 3x
    # or 1/3x while the waves are alike
    for r in range(3):
        for arm, lucky in (("stock", 0), ("suffixmem", 1)):
            for s in range(3):
                x = _rec(arm, r, 2, 50.0 if s == lucky else 150.0, arm == "stock")
                records.append(dict(x, session=s))
    report = summarize(records, _workload(sessions=3), 3, late_turn=2, concurrent=True)
    paired = report["paired"]
    assert paired["unit"] == "wave" and paired["turns"] == 3  # one wave per round
    assert paired["ttft_ratio_p50"] == pytest.approx(1.0)
    assert paired["stock_first"]["turns"] == 3
    per_session = summarize(records, _workload(sessions=3), 3, late_turn=2)["paired"]
    assert per_session["unit"] == "turn" and per_session["turns"] == 9
    assert report["same_prompts"] == 1.0  # still matched turn by turn


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


@pytest.mark.slow
@pytest.mark.vllm
def test_tiny_concurrent_paired_run_sends_each_arms_sessions_at_once(vllm_engine: Any) -> None:
    import threading

    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.chat.peers import EngineOptions

    sessions, turns, repeats = 2, 2, 3
    workload = Workload(
        name="default", system_prompt="You answer in one short sentence. " * 8,
        sessions=[["What is a cat?", "And a dog?"], ["Name a colour.", "Another one?"]],
        max_tokens=3)
    callers: list[str] = []
    stream = vllm_engine.stream

    def noting(request: Any) -> Any:  # which thread sent each request
        callers.append(threading.current_thread().name)
        return stream(request)

    vllm_engine.stream = noting
    try:
        report, records = run_paired(workload, EngineOptions(model=DEFAULT_MODEL, max_tokens=3),
                                     repeats, late_turn=2, engine=vllm_engine, concurrent=True)
    finally:
        del vllm_engine.stream
    assert len(records) == 2 * repeats * sessions * turns
    assert report["workload"]["mode"] == "concurrent"
    # the requests came from the wave pool's threads (one per session), never the caller's
    assert len(callers) == len(records)
    assert len(set(callers)) == sessions and threading.current_thread().name not in callers
    for r in range(repeats):
        for t in (1, 2):
            wave = [x for x in records if x["round"] == r and x["turn"] == t]
            for arm in ("stock", "suffixmem"):
                mine = [x for x in wave if x["arm"] == arm]
                assert len({x["first"] for x in mine}) == 1  # a wave is one arm's
                assert len({x["busy_ms"] for x in mine}) == 1  # its time split evenly
                assert all(0 < x["pre_engine_ms"] < x["ttft_ms"] for x in mine)
    for arm in ("stock", "suffixmem"):
        assert report["arms"][arm]["output_tokens"] == repeats * sessions * turns * 3
        assert len(report["arms"][arm]["output_tok_s"]["runs"]) == repeats
    assert math.isfinite(report["paired"]["throughput_ratio"])
    assert report["same_prompts"] == 1.0


@pytest.mark.slow
@pytest.mark.vllm
def test_app_scope_pairs_share_within_each_arm_and_round_only(vllm_engine: Any) -> None:
    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.chat.peers import EngineOptions

    repeats = 3
    workload = Workload(
        name="default",
        system_prompt="You are a helpful assistant who answers every question in one short "
                      "sentence. " * 6,
        sessions=[["What is a cat?", "And a dog?"], ["Name a colour.", "Another one?"]],
        max_tokens=3)
    before = vllm_engine.isolation
    with pytest.raises(ValueError, match="scope"):
        run_paired(workload, EngineOptions(model=DEFAULT_MODEL, max_tokens=3), repeats,
                   engine=vllm_engine, scope="tenant")
    report, records = run_paired(workload, EngineOptions(model=DEFAULT_MODEL, max_tokens=3),
                                 repeats, late_turn=2, engine=vllm_engine, scope="app")
    assert vllm_engine.isolation == before  # the engine's own scope is put back
    assert report["workload"]["scope"] == "app"
    by_key = {(x["arm"], x["round"], x["session"], x["turn"]): x for x in records}
    for arm in ("stock", "suffixmem"):
        for r in range(repeats):
            # a new tenant per arm and round: the round's first turn finds nothing, not even
            # the other arm's identical prompt of a moment ago
            assert by_key[(arm, r, 0, 1)]["cached_tokens"] == 0, (arm, r)
            # within the arm's tenant, session 1 finds session 0's system prompt
            assert by_key[(arm, r, 1, 1)]["cached_tokens"] > 0
