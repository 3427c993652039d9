"""``bench chat``'s issue-19 speed verdicts from pairs on one engine (``chat/same_engine``):
which configurations pair, how the paired ratios replace the process ratios in the targets,
and a real pair on one vLLM engine."""

from __future__ import annotations

import math
from typing import Any

import pytest

from suffixmem_bench.chat import same_engine
from suffixmem_bench.chat.metrics import evaluate_targets
from suffixmem_bench.chat.paired_report import summarize
from suffixmem_bench.chat.workload import Workload

TTFT = same_engine.TTFT_TARGET_KEY
TOK = same_engine.THROUGHPUT_TARGET_KEY


def _ok(**figures: float) -> dict[str, Any]:
    return {"status": "ok", "latency_p50_s": 0.3, **figures}


def _process_results() -> dict[str, dict[str, Any]]:
    """Process rounds in which the vLLM engine's configurations miss both speed targets (a
    slower process), and the torch engine passes."""
    return {
        "vllm_direct": _ok(ttft_p50_from_turn8_s=0.040, output_tok_s=60.0),
        "vllm_direct_salted": _ok(ttft_p50_from_turn8_s=0.040, output_tok_s=60.0),
        "suffixmem_vllm": _ok(ttft_p50_from_turn8_s=0.046, output_tok_s=54.0),
        "suffixmem_vllm_app": _ok(ttft_p50_from_turn8_s=0.046, output_tok_s=54.0),
        "suffixmem_torch": _ok(ttft_p50_from_turn8_s=0.030, output_tok_s=90.0),
    }


def _paired_report(ours_ms: float, late_turn: int = 2) -> dict[str, Any]:
    """``run_paired``'s report from hand-made records: stock 100 ms a turn, ours ``ours_ms``."""
    records = []
    for r in range(3):
        for t in (1, 2):
            for arm, ttft in (("stock", 100.0), ("suffixmem", ours_ms)):
                records.append({
                    "arm": arm, "round": r, "session": 0, "turn": t, "first": arm == "stock",
                    "ttft_ms": ttft, "latency_ms": ttft + 100, "pre_engine_ms": 1.0,
                    "busy_ms": ttft + 100, "engine_ttft_ms": ttft - 2, "prompt_tokens": 100,
                    "cached_tokens": 64, "output_tokens": 4,
                    "manager_overhead_ms": 0.5 if arm == "suffixmem" else None})
    workload = Workload(name="default", system_prompt="Be brief.",
                        sessions=[["a?", "b?"]], max_tokens=4)
    return summarize(records, workload, 3, late_turn=late_turn)


def test_only_vllm_configurations_that_ran_beside_their_peer_are_paired() -> None:
    results = _process_results()
    assert same_engine.pairs_to_run(results) == ["suffixmem_vllm", "suffixmem_vllm_app"]
    results["vllm_direct"] = {"status": "error", "reason": "boom"}
    assert same_engine.pairs_to_run(results) == ["suffixmem_vllm"]
    del results["vllm_direct_salted"]
    assert same_engine.pairs_to_run(results) == []


def test_paired_ratios_decide_the_speed_targets_and_say_so() -> None:
    results = _process_results()
    targets = evaluate_targets(results, "default")
    assert targets[TTFT]["configs"]["suffixmem_vllm"]["passed"] is False  # 1.15x in processes
    assert targets[TOK]["configs"]["suffixmem_vllm"]["passed"] is False  # 0.9x
    pairs = {"suffixmem_vllm": same_engine.summary(_paired_report(101.0),
                                                   "vllm_direct_salted", "session"),
             "suffixmem_vllm_app": {"status": "error", "peer": "vllm_direct", "scope": "app",
                                    "reason": "RuntimeError: no engine"}}
    same_engine.apply(targets, pairs)
    ttft = targets[TTFT]["configs"]
    assert ttft["suffixmem_vllm"]["method"] == "paired"
    assert ttft["suffixmem_vllm"]["value"] == pytest.approx(1.01)
    assert ttft["suffixmem_vllm"]["limit"] == 1.03 and ttft["suffixmem_vllm"]["passed"] is True
    assert ttft["suffixmem_vllm"]["processes"]["passed"] is False  # kept beside it
    assert ttft["suffixmem_vllm"]["peer"] == "vllm_direct_salted"
    # a failed pair and the torch engine keep their process verdicts, and say so
    assert ttft["suffixmem_vllm_app"]["method"] == "processes"
    assert ttft["suffixmem_vllm_app"]["passed"] is False
    assert ttft["suffixmem_torch"]["method"] == "processes"
    assert ttft["suffixmem_torch"]["passed"] is True
    assert targets[TTFT]["passed"] is False  # the app scope's process verdict still counts
    tok = targets[TOK]["configs"]["suffixmem_vllm"]
    # equal tokens, busy time 201 vs 200 ms a turn
    assert tok["value"] == pytest.approx(200 / 201) and tok["passed"] is True
    assert "paired ratio on one engine" in targets[TOK]["rule"]


def test_a_slower_pair_fails_and_a_short_workload_has_no_verdict() -> None:
    slow = same_engine.summary(_paired_report(104.0), "vllm_direct_salted", "session")
    targets = evaluate_targets(_process_results(), "default")
    same_engine.apply(targets, {"suffixmem_vllm": slow})
    assert targets[TTFT]["configs"]["suffixmem_vllm"]["passed"] is False  # 1.04 > 1.03
    # no turn at or after turn 8: the ratio is NaN, which is no verdict, not a failure
    short = same_engine.summary(_paired_report(101.0, late_turn=8), "vllm_direct_salted",
                                "session")
    assert math.isnan(short["ttft_ratio_p50"])
    targets = evaluate_targets(_process_results(), "default")
    same_engine.apply(targets, {"suffixmem_vllm": short})
    assert targets[TTFT]["configs"]["suffixmem_vllm"]["passed"] is None
    assert targets[TTFT]["passed"] is None


@pytest.mark.slow
@pytest.mark.vllm
def test_a_real_pair_on_one_engine_feeds_the_targets(vllm_engine: Any) -> None:
    from suffixmem.config import DEFAULT_MODEL
    from suffixmem_bench.chat.peers import EngineOptions

    turns = 8  # issue 19's figures start at turn 8
    workload = Workload(
        name="default",
        system_prompt="You are a helpful assistant who answers in one short sentence. " * 4,
        sessions=[[f"Name animal number {t + 1}." for t in range(turns)]], max_tokens=4)
    seen: list[tuple[str, int, int]] = []
    pairs = same_engine.run_pairs(
        ["suffixmem_vllm"], workload, EngineOptions(model=DEFAULT_MODEL, max_tokens=4,
                                                    threads=2),
        repeats=3, concurrent=False, progress=lambda *a: seen.append(a), engine=vllm_engine)
    pair = pairs["suffixmem_vllm"]
    assert pair["status"] == "ok", pair
    assert seen[-1] == ("suffixmem_vllm", 3 * turns, 3 * turns)
    assert pair["turns"] == 3 and pair["unit"] == "turn"  # turn 8 of each round
    assert pair["same_prompts"] == 1.0
    assert 0.2 < pair["ttft_ratio_p50"] < 5 and 0.2 < pair["throughput_ratio"] < 5
    ours = pair["arms"]["suffixmem"]
    assert 0 < ours["manager_overhead_ms_p50"] <= ours["manager_overhead_ms_p99"]
    assert len(pair["round_ratio"]["output_tok_s"]["runs"]) == 3
    targets = evaluate_targets(_process_results(), "default")
    same_engine.apply(targets, pairs)
    entry = targets[TTFT]["configs"]["suffixmem_vllm"]
    assert entry["method"] == "paired" and entry["value"] == pair["ttft_ratio_p50"]
    assert entry["passed"] is (pair["ttft_ratio_p50"] <= 1.03)


SCRIPT = """
import sys
from pathlib import Path
from suffixmem.config import DEFAULT_MODEL
from suffixmem.engine import create_engine
from suffixmem_bench.chat.same_engine import vllm_log_to
with vllm_log_to(Path(sys.argv[1])) as config:
    engine = create_engine("vllm", model=DEFAULT_MODEL, max_model_len=512,
                           extra={"log_config_file": config})
    engine.close()
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_log_lines_go_to_a_file_while_pairing(tmp_path: Any) -> None:
    """The paired phase builds vLLM in the benchmark's own process: what vLLM logs on import and
    while it builds the engine (it reconfigures its logging then) goes to a log file, as each
    configuration's child process's does, not into the benchmark's stderr. A fresh interpreter,
    since vLLM logs its import-time warnings once per process."""
    import subprocess
    import sys

    path = tmp_path / "paired.log"
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    text = path.read_text()
    assert "WARNING" in text and "Enforce eager" in text  # vLLM's CPU start-up warning
    assert "Enforce eager" not in run.stderr and "WARNING" not in run.stderr, run.stderr[-2000:]
