"""``suffixmem bench pool``: runs of one command pooled into one report whose spreads cover
every run's rounds, in all three report shapes, and the held-out check that measures them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from suffixmem_bench.compare import compare, figures
from suffixmem_bench.pool import held_out, pool

MACHINE = {"cpu": "AMD EPYC", "isa": "avx512_bf16", "cores": 2, "l3": "32768K",
           "memory_gib": 23.5, "dtype": "bfloat16"}


def _chat(rounds: list[float], ratio: float, commit: str, passed: bool = True) -> dict:
    """A ``bench chat`` report: a figure with rounds, a run-level ratio without, a target."""
    ordered = sorted(rounds)
    return {"configs": {"suffixmem_vllm": {
        "output_tok_s": ordered[len(rounds) // 2], "hit_rate": 0.9, "repeats": len(rounds),
        "spread": {"output_tok_s": [ordered[0], ordered[-1]], "hit_rate": [0.9, 0.9]},
        "runs": {"output_tok_s": rounds, "hit_rate": [0.9] * len(rounds)},
        "by_turn": {"ttft_s": [0.1, 0.3]}, "status": "ok"}},
        "same_engine": {"suffixmem_vllm": {"ttft_ratio_p50": ratio}},
        "targets": {"speed": {"passed": passed}},
        "workload": {"name": "default", "sessions": 4, "repeats": len(rounds)},
        "machine": {**MACHINE, "git_commit": commit}, "commit": commit, "noisy": False,
        "load_avg": {"before": [0.5, 0.5, 0.5]}, "date": "2026-12-05"}


def test_rounds_of_every_run_make_the_pooled_spread() -> None:
    a = _chat([50.0, 52.0, 54.0], 0.96, "aaa")
    b = _chat([60.0, 61.0, 62.0], 0.98, "bbb", passed=False)
    out = pool([a, b], ["a.json", "b.json"])
    cfg = out["configs"]["suffixmem_vllm"]
    assert cfg["runs"]["output_tok_s"] == [50.0, 52.0, 54.0, 60.0, 61.0, 62.0]
    assert cfg["output_tok_s"] == 57.0 and cfg["spread"]["output_tok_s"] == [50.0, 62.0]
    assert cfg["repeats"] == 6 and cfg["hit_rate"] == 0.9
    # a run-level figure gets the runs' range beside it, and compare reads it
    se = out["same_engine"]["suffixmem_vllm"]
    assert se["ttft_ratio_p50"] == pytest.approx(0.97)
    assert se["spread"]["ttft_ratio_p50"] == [0.96, 0.98]
    assert se["across_runs"]["ttft_ratio_p50"] == [0.96, 0.98]
    names = dict(figures(out))
    assert names["same_engine.suffixmem_vllm.ttft_ratio_p50"] == pytest.approx((0.97, 0.96, 0.98))
    assert out["targets"]["speed"] == {"rule": None, "passed": False,  # held in one run only
                                       "passed_by_run": [True, False]}
    assert out["commit"] == "aaa+bbb" and out["noisy"] is False
    assert [p["path"] for p in out["pooled_from"]] == ["a.json", "b.json"]
    # a third run inside the pooled spreads survives where it would leave either run's own
    c = _chat([55.0, 56.0, 57.0], 0.97, "ccc")
    assert not compare(a, c)["survives"] and not compare(b, c)["survives"]
    assert compare(out, c)["survives"]


def test_spread_dicts_and_engines_fields_pool_their_rounds() -> None:
    def serve(runs: list[float]) -> dict:
        return {"suffixmem": {"throughput_tok_s": sorted(runs)[1], "spread": {
            "throughput_tok_s": {"median": sorted(runs)[1], "min": min(runs),
                                 "max": max(runs), "runs": runs}}},
                "stock": {"ttft": {"median": 2.0, "min": 1.0, "max": 3.0}},
                "engines": {"torch": {"decode_ms": sorted(runs)[1], "decode_ms_runs": runs,
                                      "decode_ms_min": min(runs), "decode_ms_max": max(runs)}}}

    out = pool([serve([300.0, 310.0, 320.0]), serve([330.0, 340.0, 350.0])])
    assert out["suffixmem"]["throughput_tok_s"] == 325.0
    assert out["suffixmem"]["spread"]["throughput_tok_s"]["runs"] == [
        300.0, 310.0, 320.0, 330.0, 340.0, 350.0]
    assert out["stock"]["ttft"] == {"median": 2.0, "min": 1.0, "max": 3.0, "pooled": "envelope"}
    torch = out["engines"]["torch"]
    assert (torch["decode_ms"], torch["decode_ms_min"], torch["decode_ms_max"]) == (
        325.0, 300.0, 350.0)
    names = dict(figures(out))
    assert names["suffixmem.throughput_tok_s"] == (325.0, 300.0, 350.0)
    assert names["engines.torch.decode_ms"] == (325.0, 300.0, 350.0)


def test_only_quiet_runs_of_one_command_on_one_host_pool() -> None:
    a = _chat([50.0, 52.0, 54.0], 0.96, "aaa")
    noisy = {**_chat([50.0, 52.0, 54.0], 0.96, "bbb"), "noisy": True}
    with pytest.raises(ValueError, match=r"^b\.json is a noisy run"):
        pool([a, noisy], ["a.json", "b.json"])
    other_host = _chat([50.0, 52.0, 54.0], 0.96, "bbb")
    other_host["machine"]["l3"] = "260M"
    with pytest.raises(ValueError, match=r"^b\.json has another machine than a\.json"):
        pool([a, other_host], ["a.json", "b.json"])
    other_workload = _chat([50.0, 52.0, 54.0], 0.96, "bbb")
    other_workload["workload"]["sessions"] = 16
    with pytest.raises(ValueError, match="another workload"):
        pool([a, other_workload], ["a.json", "b.json"])
    # a difference named in ignore pools, and the pooled report says what differed
    out = pool([a, other_workload], ["a.json", "b.json"], ignore=["workload.sessions"])
    assert out["pooled_differences"] == {"workload.sessions": [4, 16]}
    with pytest.raises(ValueError, match=r"only workload\.KEY or machine\.KEY"):
        pool([a, other_workload], ignore=["configs.x"])
    # how a run was interleaved or how many rounds it had does not make another workload
    five = _chat([50.0, 51.0, 52.0, 53.0, 54.0], 0.96, "bbb")
    assert pool([a, five])["configs"]["suffixmem_vllm"]["repeats"] == 8


def test_held_out_compares_each_run_with_the_pool_of_the_others() -> None:
    runs = [_chat([50.0, 52.0, 54.0], 0.96, "a"), _chat([53.0, 55.0, 57.0], 0.97, "b"),
            _chat([51.0, 53.0, 70.0], 0.99, "c")]
    result = held_out(runs, ["a", "b", "c"])
    rows = {r["report"]: r for r in result["held_out"]}
    # a's throughput (52) lies in b's and c's rounds [51, 70], its ratio (0.96) outside theirs
    assert rows["a"]["outside"] == ["same_engine.suffixmem_vllm.ttft_ratio_p50"]
    assert rows["b"]["outside"] == [] and rows["b"]["figures"] == 3
    assert rows["c"]["outside"] == ["same_engine.suffixmem_vllm.ttft_ratio_p50"]
    assert result["figures"] == sum(r["figures"] for r in rows.values())
    # runs that differ in a field pool for the check when it is named, as for the pool
    other = _chat([52.0, 53.0, 54.0], 0.97, "d")
    other["workload"]["sessions"] = 16
    with pytest.raises(ValueError, match="another workload"):
        held_out([*runs, other], ["a", "b", "c", "d"])
    assert len(held_out([*runs, other], ["a", "b", "c", "d"],
                        ignore=["workload.sessions"])["held_out"]) == 4
    with pytest.raises(ValueError, match="at least 3 reports"):
        held_out(runs[:2], ["a", "b"])


def test_cli_writes_the_pooled_report_and_refuses_bad_input(
        tmp_path: Path, bench_app: Any) -> None:
    from typer.testing import CliRunner

    from suffixmem_bench.pool import register

    app = bench_app(register)
    paths = []
    for i, rounds in enumerate(([50.0, 52.0, 54.0], [60.0, 61.0, 62.0])):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_chat(rounds, 0.96, f"c{i}")))
    runner = CliRunner()
    out = tmp_path / "pooled" / "report.json"
    ok = runner.invoke(app, ["bench", "pool", *map(str, paths), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["configs"]["suffixmem_vllm"]["output_tok_s"] == 57.0
    bad = runner.invoke(app, ["bench", "pool", str(paths[0]), str(tmp_path / "nope.json")])
    assert bad.exit_code == 2 and "cannot read" in bad.output
