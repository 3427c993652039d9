"""Percentiles, the hit ceiling from real token ids, the summary figures, ratios and targets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suffixmem_bench.chat.metrics import (
    CeilingTracker,
    TurnRecord,
    add_ratios,
    by_turn,
    common_prefix_len,
    evaluate_targets,
    merge_repeats,
    percentile,
    summarize,
)
from suffixmem_bench.chat.report import markdown_table


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(0, 100))
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_percentile_edges() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [6]) == 0


def _render(tokenizer, messages: list[dict[str, str]]) -> list[int]:  # type: ignore[no-untyped-def]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_hit_ceiling_from_real_chat_template_ids(tokenizer) -> None:  # type: ignore[no-untyped-def]
    system = {"role": "system", "content": "You are a helpful assistant who answers briefly."}
    u1 = {"role": "user", "content": "What is a computer?"}
    reply = "A computer is an electronic device that processes data."
    u2 = {"role": "user", "content": "Who invented computers?"}
    p1 = _render(tokenizer, [system, u1])
    reply_ids = list(tokenizer(reply, add_special_tokens=False)["input_ids"])
    p2 = _render(tokenizer, [system, u1, {"role": "assistant", "content": reply}, u2])

    tracker = CeilingTracker()
    assert tracker.observe("a", p1, reply_ids) == 0  # nothing seen before in the session
    seen = tracker.observe("a", p2, [])
    # ChatML: the second prompt repeats the first prompt and the reply, then adds the
    # end-of-turn token, which the reply ids (without it) do not contain
    assert p2[: len(p1) + len(reply_ids)] == p1 + reply_ids
    assert seen == len(p1) + len(reply_ids)
    assert p2[seen] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    # another session has seen nothing, even with the same prompt
    assert tracker.observe("b", p2, []) == 0
    # a prompt that diverges inside the history only counts the common part
    edited = _render(tokenizer, [system, {"role": "user", "content": "What is a car?"}])
    assert tracker.observe("a", edited, []) == common_prefix_len(edited, p2)
    assert 0 < common_prefix_len(edited, p2) < len(p1)


def _records() -> list[TurnRecord]:
    # 2 sessions x 9 turns; ttft grows with the turn number, latency = 2 * ttft
    out = []
    for t in range(1, 10):
        for s in range(2):
            ttft = t / 10 + s / 100
            out.append(TurnRecord(session=s, turn=t, prompt_tokens=100 * t, cached_tokens=
                                  50 * t if t > 1 else 0, output_tokens=4,
                                  seen_tokens=90 * t if t > 1 else 0,
                                  ttft_s=ttft, latency_s=2 * ttft))
    return out


def test_summarize_and_by_turn() -> None:
    recs = _records()
    fig = summarize(recs, wall_s=9.0)
    assert fig["turns"] == 18
    assert fig["ttft_p50_s"] == pytest.approx(percentile([r.ttft_s for r in recs], 50))
    # from turn 8: turns 8 and 9 of both sessions -> 0.80, 0.81, 0.90, 0.91
    assert fig["ttft_p50_from_turn8_s"] == pytest.approx(0.855)
    assert fig["latency_p99_s"] == pytest.approx(percentile([r.latency_s for r in recs], 99))
    prompt = sum(100 * t for t in range(1, 10)) * 2
    assert fig["prompt_tokens"] == prompt
    assert fig["output_tok_s"] == pytest.approx(18 * 4 / 9.0)
    assert fig["prompt_tok_s"] == pytest.approx(prompt / 9.0)
    assert fig["hit_rate"] == pytest.approx(sum(50 * t for t in range(2, 10)) * 2 / prompt)
    assert fig["hit_ceiling"] == pytest.approx(sum(90 * t for t in range(2, 10)) * 2 / prompt)
    bt = by_turn(recs)
    assert bt["turn"] == list(range(1, 10))
    assert bt["ttft_p50_s"][0] == pytest.approx(0.105)
    assert bt["hit_rate"][0] == 0.0 and bt["hit_rate"][4] == pytest.approx(0.5)
    assert bt["hit_ceiling"][4] == pytest.approx(0.9)


def _ok(**figures: float) -> dict[str, object]:
    base = {"status": "ok", "ttft_p50_s": 1.0, "ttft_p50_from_turn8_s": 1.0, "ttft_p99_s": 1.0,
            "latency_p50_s": 1.0, "latency_p99_s": 1.0, "output_tok_s": 10.0,
            "prompt_tok_s": 100.0, "hit_rate": 0.0, "hit_ceiling": 0.9, "peak_rss_mb": 1000.0}
    base.update(figures)
    return base


def test_ratios_and_default_targets() -> None:
    configs = {
        "naive": _ok(),
        "vllm_direct": _ok(ttft_p50_from_turn8_s=0.1, latency_p50_s=0.5, output_tok_s=20.0),
        "suffixmem_vllm": _ok(ttft_p50_from_turn8_s=0.105, latency_p50_s=0.5,
                              output_tok_s=19.0, hit_rate=0.85),
        "suffixmem_torch": _ok(ttft_p50_from_turn8_s=0.3, latency_p50_s=0.6,
                               output_tok_s=15.0),
        "suffixmem_torch_segments": {"status": "missing", "reason": "not built"},
    }
    add_ratios(configs)
    assert configs["suffixmem_vllm"]["ttft_p50_from_turn8_vs_naive"] == pytest.approx(0.105)
    assert configs["suffixmem_vllm"]["output_tok_vs_naive"] == pytest.approx(1.9)
    assert configs["naive"]["peak_rss_mb_vs_naive"] == 1.0
    assert "ttft_p50_vs_naive" not in configs["suffixmem_torch_segments"]
    t = evaluate_targets(configs, "default")
    fifth = t["ttft_from_turn8_le_fifth_of_naive"]
    assert fifth["configs"]["suffixmem_vllm"]["passed"] is True
    assert fifth["configs"]["suffixmem_torch"]["passed"] is False
    assert fifth["passed"] is False
    assert "suffixmem_torch_segments" not in fifth["configs"]  # did not run: no verdict
    within = t["ttft_p50_from_turn8_within_10pct_of_vllm_direct"]["configs"]
    assert within["suffixmem_vllm"]["passed"] is True  # 0.105 <= 0.11
    assert within["suffixmem_torch"]["passed"] is False
    assert t["output_tok_s_within_10pct_of_vllm_direct"]["configs"]["suffixmem_vllm"][
        "passed"] is True  # 19 >= 20 / 1.1
    assert "output_throughput_ge_2_3x_naive" not in t  # long-workload target


def test_long_targets_and_missing_reference() -> None:
    configs = {
        "naive": _ok(),
        "suffixmem_vllm": _ok(ttft_p50_from_turn8_s=0.04, output_tok_s=25.0, hit_rate=0.86,
                              hit_ceiling=0.9),
    }
    t = evaluate_targets(configs, "long")
    assert t["ttft_from_turn8_le_twentieth_of_naive"]["passed"] is True
    assert t["output_throughput_ge_2_3x_naive"]["passed"] is True
    assert t["hit_rate_ge_95pct_of_ceiling"]["configs"]["suffixmem_vllm"]["passed"] is True
    # vllm_direct did not run: those targets have no verdict rather than a guessed one
    assert t["latency_p50_within_10pct_of_vllm_direct"]["passed"] is None
    configs["suffixmem_vllm"]["hit_rate"] = 0.85  # 0.85 < 0.95 * 0.9 = 0.855
    t = evaluate_targets(configs, "long")
    assert t["hit_rate_ge_95pct_of_ceiling"]["passed"] is False


def test_cross_session_ceiling_counts_what_any_session_saw() -> None:
    tracker = CeilingTracker()
    system = [1, 2, 3, 4]
    assert tracker.observe_both("a", [*system, 10], [11]) == (0, 0)
    # session b starts with the same system prompt: nothing in its own past, 4 tokens seen
    assert tracker.observe_both("b", [*system, 20], [21]) == (0, 4)
    # a's second turn: its own prompt + reply (6 tokens) beats b's shared 4
    assert tracker.observe_both("a", [*system, 10, 11, 12], []) == (6, 6)
    # a third session sending a's whole earlier conversation sees all of it across sessions
    assert tracker.observe_both("c", [*system, 10, 11, 12, 99], []) == (0, 7)


def test_summarize_reports_manager_overhead_and_both_ceilings() -> None:
    recs = _records()
    for i, r in enumerate(recs):
        r.seen_any_tokens = r.seen_tokens + 10
        r.manager_overhead_ms = float(i)  # 0 .. 17
    fig = summarize(recs, wall_s=9.0)
    assert fig["manager_overhead_ms_p50"] == pytest.approx(8.5)
    assert fig["manager_overhead_ms_p99"] == pytest.approx(percentile(range(18), 99))
    assert fig["hit_ceiling_cross_session"] == pytest.approx(
        (sum(90 * t for t in range(2, 10)) * 2 + 180) / fig["prompt_tokens"])
    # peers have no manager: no overhead figure rather than zero
    assert math.isnan(summarize(_records(), 9.0)["manager_overhead_ms_p50"])


def test_summarize_reports_the_turns_that_dropped_history() -> None:
    recs = _records()
    fig = summarize(recs, wall_s=9.0)
    assert fig["window_turns"] == 0 and math.isnan(fig["ttft_p50_window_s"])
    assert fig["ttft_mean_s"] == pytest.approx(sum(r.ttft_s for r in recs) / len(recs))
    assert fig["computed_tokens_mean"] == pytest.approx(
        sum(r.prompt_tokens - r.cached_tokens for r in recs) / len(recs))
    for r in recs:
        r.dropped_turns = 2 if r.turn >= 8 else 0  # turns 8 and 9 of both sessions
    fig = summarize(recs, wall_s=9.0)
    assert fig["window_turns"] == 4
    assert fig["ttft_p50_window_s"] == pytest.approx(percentile([0.8, 0.81, 0.9, 0.91], 50))
    assert TurnRecord.from_dict(recs[-1].to_dict()).dropped_turns == 2


def test_merge_repeats_takes_medians_and_spreads() -> None:
    runs = [_ok(ttft_p50_from_turn8_s=x, output_tok_s=y) for x, y in
            ((0.3, 10.0), (0.1, 30.0), (0.2, 20.0))]
    for i, r in enumerate(runs):
        r["by_turn"] = {"turn": [i]}
    m = merge_repeats(runs)
    assert m["ttft_p50_from_turn8_s"] == 0.2 and m["output_tok_s"] == 20.0
    assert m["spread"]["ttft_p50_from_turn8_s"] == [0.1, 0.3]
    assert m["runs"]["output_tok_s"] == [10.0, 30.0, 20.0]
    assert m["repeats"] == 3 and m["by_turn"] == {"turn": [2]}  # the median run's curves
    failed = {"status": "error", "reason": "boom"}
    assert merge_repeats([runs[0], failed, runs[1]]) is failed


def test_ratio_spread_pairs_each_round_with_the_baselines_same_round() -> None:
    # both configurations slowed down together in round 2: the figures' own spreads are wide,
    # the per-round ratio barely moves
    ours = merge_repeats([_ok(output_tok_s=x) for x in (50.0, 40.0, 60.0)])
    base = merge_repeats([_ok(output_tok_s=x) for x in (52.0, 44.0, 61.0)])
    configs = {"vllm_direct": base, "suffixmem_vllm": ours}
    add_ratios(configs, "vllm_direct")
    lo, hi = ours["spread"]["output_tok_vs_vllm_direct"]
    assert (lo, hi) == (pytest.approx(40 / 44), pytest.approx(60 / 61))
    assert ours["output_tok_vs_vllm_direct"] == pytest.approx(50 / 52)  # medians' ratio
    assert base["spread"]["output_tok_vs_vllm_direct"] == [1.0, 1.0]
    table = markdown_table({"configs": configs})
    assert "50.0 [40.0–60.0] (0.96× direct [0.91–0.98])" in table
    assert "52.0 [44.0–61.0] (1.00× direct)" in table  # a span that rounds to one value: none
    # a round whose figure was not finite leaves the rounds unpaired: no ratio spread
    holed = merge_repeats([_ok(output_tok_s=x) for x in (50.0, math.nan, 60.0)])
    configs = {"vllm_direct": base, "suffixmem_vllm": holed}
    add_ratios(configs, "vllm_direct")
    assert "output_tok_vs_vllm_direct" not in holed["spread"]
    assert holed["output_tok_vs_vllm_direct"] == pytest.approx(55 / 52)


def test_issue19_targets_against_the_same_isolation() -> None:
    configs = {
        "vllm_direct": _ok(ttft_p50_from_turn8_s=0.05, output_tok_s=30.0),
        "vllm_direct_salted": _ok(ttft_p50_from_turn8_s=0.1, output_tok_s=20.0),
        "suffixmem_vllm": _ok(ttft_p50_from_turn8_s=0.103, output_tok_s=19.4,
                              manager_overhead_ms_p50=0.8, manager_overhead_ms_p99=6.0),
        "suffixmem_torch": _ok(ttft_p50_from_turn8_s=0.104, output_tok_s=19.0),
        # one cache for the application: held to vllm_direct, which shares one cache too
        "suffixmem_vllm_app": _ok(ttft_p50_from_turn8_s=0.06, output_tok_s=25.0),
    }
    for base in ("vllm_direct", "vllm_direct_salted"):
        add_ratios(configs, base)
    assert configs["suffixmem_vllm"]["ttft_p50_from_turn8_vs_vllm_direct"] == pytest.approx(2.06)
    assert configs["suffixmem_vllm"]["output_tok_vs_vllm_direct_salted"] == pytest.approx(0.97)
    t = evaluate_targets(configs, "default")
    ttft = t["ttft_from_turn8_le_1_03x_vllm_direct_same_isolation"]["configs"]
    assert ttft["suffixmem_vllm"]["passed"] is True  # 0.103 <= 1.03 * 0.1 (salted, not 0.05)
    assert ttft["suffixmem_torch"]["passed"] is False
    # 0.06 would pass against the salted peer (0.103) but not against vllm_direct (0.0515)
    assert ttft["suffixmem_vllm_app"]["passed"] is False
    assert ttft["suffixmem_vllm_app"]["peer"] == "vllm_direct"
    tok = t["output_tok_s_ge_0_97x_vllm_direct_same_isolation"]["configs"]
    assert tok["suffixmem_vllm"]["passed"] is True and tok["suffixmem_torch"]["passed"] is False
    assert tok["suffixmem_vllm_app"]["passed"] is False  # 25 < 0.97 * 30
    p50 = t["manager_overhead_p50_le_1ms"]["configs"]
    assert p50["suffixmem_vllm"]["passed"] is True
    assert p50["suffixmem_torch"]["passed"] is None  # not measured: no verdict
    assert t["manager_overhead_p99_le_5ms"]["configs"]["suffixmem_vllm"]["passed"] is False


def test_same_text_share_compares_each_config_with_the_reference_turn_by_turn() -> None:
    from suffixmem_bench.chat.metrics import same_text_share

    turns = [{"config": c, "session": s, "turn": t, "text": x} for c, s, t, x in [
        ("naive", 0, 1, "a"), ("naive", 0, 2, "b"), ("naive", 1, 1, "c"),
        ("tier", 0, 1, "a"), ("tier", 0, 2, "B"), ("tier", 1, 1, "c"),
        ("other", 0, 1, "x"), ("other", 5, 1, "unmatched"),
    ]]
    assert same_text_share(turns, "naive") == {"other": 0.0, "tier": 2 / 3}


def test_same_text_from_drop_splits_at_each_sessions_first_dropped_turn() -> None:
    import math

    from suffixmem_bench.chat.metrics import same_text_from_drop

    def t(config: str, session: int, turn: int, text: str, dropped: int = 0,
          repeat: int = 0) -> dict[str, object]:
        return {"config": config, "repeat": repeat, "session": session, "turn": turn,
                "text": text, "dropped_turns": dropped}

    ref = [t("exact", s, n, f"{s}-{n}") for s in (0, 1) for n in (1, 2, 3, 4)]
    shift = [
        t("shift", 0, 1, "0-1"), t("shift", 0, 2, "0-2"), t("shift", 0, 3, "0-3", dropped=2),
        t("shift", 0, 4, "diverged"),                        # session 0 dropped at turn 3
        t("shift", 1, 1, "1-1"), t("shift", 1, 2, "1-2"), t("shift", 1, 3, "x"),
        t("shift", 1, 4, "1-4"),                             # session 1 never dropped
    ]
    out = same_text_from_drop(ref + shift, "exact")
    assert out["shift"]["from_drop"] == 0.5 and out["shift"]["turns_from_drop"] == 2
    assert out["shift"]["before"] == 5 / 6  # session 1's turn 3 differs without a drop
    never = same_text_from_drop([*ref, t("other", 0, 1, "0-1")], "exact")["other"]
    assert never["before"] == 1.0 and math.isnan(never["from_drop"])
