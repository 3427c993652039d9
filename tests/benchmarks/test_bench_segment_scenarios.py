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


def test_overflow_targets_add_the_turns_that_dropped_history() -> None:
    direct = {"status": "ok", "ttft_p50_s": 0.04, "ttft_p50_window_s": 0.9}
    shift = {"status": "ok", "ttft_p50_s": 0.04, "ttft_p50_window_s": 0.2}
    never = {"status": "ok", "ttft_p50_s": 0.04, "ttft_p50_window_s": float("nan")}
    t = get("overflow").targets({"vllm_direct": direct, "suffixmem_torch_segments": shift})
    assert t["ttft_p50_le_third_of_vllm_direct"]["passed"] is False  # warm turns tie
    window = t["window_turn_ttft_p50_le_third_of_vllm_direct"]
    assert window["passed"] is True
    assert window["configs"]["suffixmem_torch_segments"]["limit"] == pytest.approx(0.3)
    # a configuration whose history never outgrew the window has no such figure: n/a
    t = get("overflow").targets({"vllm_direct": direct, "suffixmem_torch": never})
    assert t["window_turn_ttft_p50_le_third_of_vllm_direct"]["passed"] is None


def test_method_labels_parse_back() -> None:
    from suffixmem.errors import InvalidRequestError

    for b in sc.blends():
        assert sc.parse_method(b.label()) == b
    for label in ("k16-q0.1", "k0-r0.15@1,4-q0.05", "k8-q0.2-L4", "k16-p0.1"):
        assert sc.parse_method(label).label() == label
    assert sc.parse_method("k16-q0.1").query_ratio == pytest.approx(0.1)
    assert sc.parse_method("k16-p0.1").query_patch and not sc.parse_method("k16-q0.1").query_patch
    with pytest.raises(InvalidRequestError, match=r"method 'r0\.3'"):
        sc.parse_method("r0.3")


def row(kl: float, top1: float, free: float, task: float, cost: float) -> dict[str, float]:
    return {"mean_kl": kl, "top1_agreement": top1, "free_running_agreement": free,
            "task_agreement": task, "compute_share": cost}


def test_choose_method_takes_the_cheapest_passing_one_else_the_most_accurate() -> None:
    rows = {"k16": row(0.03, 0.95, 0.2, 0.5, 0.2), "k16-r0.5@1": row(0.01, 0.98, 0.6, 1.0, 0.6),
            "k16-r0.3@1": row(0.015, 0.975, 0.55, 0.95, 0.45),
            "k0-r1@1": row(0.0, 1.0, 1.0, 1.0, 1.1)}
    assert sc.gate_passed(rows["k16-r0.3@1"]) and not sc.gate_passed(rows["k16"])
    assert sc.choose_method(rows) == ("k16-r0.3@1", True)
    # the full-recompute control is never chosen, even when it alone passes
    failing = {"k16": rows["k16"], "k32": row(0.02, 0.96, 0.3, 0.8, 0.3),
               "k0-r1@1": rows["k0-r1@1"]}
    assert sc.choose_method(failing) == ("k32", False)


def test_first_line_end_counts_tokens_to_the_first_newline() -> None:
    pieces = ["\n", "json", ".", "loads", "\n", "more"]
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert sc.first_line_end(decode, list(range(6))) == 5  # a leading newline does not count
    assert sc.first_line_end(decode, [1, 2, 3]) == 3
    assert sc.first_line_end(None, [1, 2]) == 2


def test_shift_event_places_the_runs_found_after_the_prefix_hit() -> None:
    from suffixmem_bench.segment_events import event_summary, shift_event

    system = list(range(1000, 1040))  # 40 tokens: the prefix hit covers 32 (whole blocks)
    old_turns, kept = list(range(2000, 2050)), list(range(3000, 3060))
    previous = system + old_turns + kept + list(range(4000, 4020))  # the last reply
    ids = system + kept + [9, 9, 9]
    ev = shift_event(previous, ids)
    assert ev is not None and len(ev.fills) == 1 and ev.fills[0][0] == previous
    # the kept turns moved from 90 to 40; the system prompt's tail after the whole-block hit
    # (8 tokens at the same position) is shorter than a run
    assert ev.spans == ((40, 100),) and ev.origin == ((0, 90),)
    assert previous[90:150] == ids[40:100]
    assert shift_event(previous, system + [5] * 40) is None  # nothing long enough moved
    # KV lies in whole blocks only (the last one, partial, was never cached)
    short = shift_event(system + old_turns + kept, ids)
    assert short is not None and short.spans == ((40, 94),)  # 150 // 16 * 16 = 144 = 90 + 54
    assert event_summary([ev])["events"] == 1 and event_summary([])["events"] == 0


def test_workload_defaults_follow_the_gate() -> None:
    from suffixmem_bench.segment_events import workload_defaults

    good, bad = row(0.01, 0.98, 0.6, 1.0, 0.5), row(0.03, 0.93, 0.1, 0.5, 0.2)
    events = {"overflow": {"methods": {"k16": good}, "chosen": "k16"},
              "rag": {"methods": {"k16": bad}, "chosen": "k16"}}
    d = workload_defaults(bad, "k16", events)
    assert d["overflow"]["segment_reuse"] and d["overflow"]["why"] == "gate passed"
    assert not d["documents"]["segment_reuse"]
    assert d["rag"]["why"].startswith("gate missed on top-1, KL, free-running, task")
    assert workload_defaults(None, None, {})["rag"]["segment_reuse"] is False
    # whole sessions served with the chosen method (reuse chained turn over turn) must keep
    # the task bar too; sessions served with another method only report theirs
    events["rag"] = {"methods": {"k16": good}, "chosen": "k16"}
    for method, task, on in (("k16", 0.95, True), ("k16", 0.85, False), ("k0", 0.5, True)):
        events["rag"]["chained"] = {"method": method, "task_agreement": task}
        d = workload_defaults(bad, "k16", events)["rag"]
        assert d["segment_reuse"] is on and d["chained_task_agreement"] == task, method
        assert d["why"] == ("gate passed" if on else "gate missed on the chained sessions' "
                            "task: exact mode stays the default")


@pytest.mark.slow
def test_methods_quality_control_is_exact_and_reuse_is_not(encode, fp32_llama) -> None:  # type: ignore[no-untyped-def]
    from suffixmem.engine.reuse.blend import BlendConfig

    p = sc.build_scenario(encode, "independent", count=1, segment_tokens=60, seed=3)
    control, moved = BlendConfig(first_k=0, ratio=1.0), BlendConfig(first_k=0)
    rows = sc.methods_quality(fp32_llama, p, [control, moved], continuation=8)
    c, m = rows[control.label()], rows[moved.label()]
    assert c["mean_kl"] < 1e-6 and c["top1_agreement"] == c["free_running_agreement"] == 1.0
    assert c["task_agreement"] == 1.0 and c["compute_share"] > 1.0  # plus the check pass
    assert m["mean_kl"] > 1e-4 and m["compute_share"] < 0.5


def test_rag_workload_travels_to_a_worker_with_its_turn_prompts(encode) -> None:  # type: ignore[no-untyped-def]
    from suffixmem_bench.chat.peers import TextHistory
    from suffixmem_bench.chat.workload import Workload

    count = lambda text: len(encode(text))  # noqa: E731
    rag = get("rag").build(count, sessions=2, turns=2)
    back = Workload.from_dict(rag.to_dict())  # what the worker process rebuilds
    assert back.system_prompt_at(1, 1) == rag.turn_systems[1][1]
    assert get("overflow").build(count, sessions=1, turns=2).system_prompt_at(0, 0) is None
    hist = TextHistory(None)
    hist.open(0, "old")
    hist.append(0, "q", "a")
    hist.set_system(0, "new")
    assert hist.history[0] == [{"role": "system", "content": "new"},
                               {"role": "user", "content": "q"},
                               {"role": "assistant", "content": "a"}]


def test_rag_event_places_seen_passages_and_the_shifted_history() -> None:
    """A passage an earlier prompt computed comes from that prompt; context shift's runs against
    the session's previous sequence cover the rest, never a passage's span twice."""
    from suffixmem_bench.segment_events import rag_event

    p1, p2, p3 = (list(range(b, b + 40)) for b in (1000, 2000, 4000))
    history = list(range(3000, 3064))
    first = [1] * 16 + p1 + p2 + [5] * 8
    seen: dict = {}
    assert rag_event(None, first, [(16, 56), (56, 96)], seen) is None  # nothing seen yet
    assert set(seen) == {tuple(p1), tuple(p2)}
    previous = first + history  # the previous sequence: its prompt (history at 104..167)
    new = [1] * 16 + p2 + p3 + [5] * 8 + history + [7] * 5
    event = rag_event(previous, new, [(16, 56), (56, 96)], seen)
    assert event is not None
    # p2 from the first prompt (where it sat at 56); p3 is new (stored, not placed); the
    # template's tail and the history from the previous sequence's whole cached blocks (96 up
    # to 160; p2 there is not placed twice)
    assert event.spans == ((16, 56), (96, 160))
    assert event.origin == ((0, 56), (1, 96))
    assert event.fills[0] == (first, ((56, 96),))
    assert event.fills[1] == (previous, ((96, 160),))
    assert tuple(p3) in seen


def test_task_agreement_splits_by_whether_the_exact_run_was_right() -> None:
    row = {"task_agreement": [1.0, 0.0, 1.0, 0.0, 1.0],
           "task_exact_accuracy": [1.0, 1.0, 1.0, 0.0, 0.0]}
    split = sc.by_exact(row)
    assert split == {"task_agreement_exact_right": pytest.approx(2 / 3),
                     "task_agreement_exact_wrong": pytest.approx(0.5)}
    assert sc.by_exact({"task_agreement": [1.0]}) == {}  # no answers: no split
    assert sc.by_exact({"task_agreement": [1.0], "task_exact_accuracy": [1.0]}) == {
        "task_agreement_exact_right": 1.0}
