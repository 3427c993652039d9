"""``suffixmem bench compare``: which figures of a rerun leave the published spreads, in both
report shapes (``measure.spread`` dicts and ``bench chat``'s ``spread`` lists), and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from suffixmem_bench.compare import compare, figures


def _chat(tok_s: float, ratio: float, lo: float, hi: float) -> dict:
    return {"configs": {"suffixmem_vllm": {
        "output_tok_s": tok_s, "hit_rate": 0.92, "turns": 40,
        "output_tok_vs_vllm_direct": ratio,
        "spread": {"output_tok_s": [lo, hi], "hit_rate": [0.92, 0.92], "turns": [40, 40],
                   "output_tok_vs_vllm_direct": [0.9, 1.1]},
        "runs": {"output_tok_s": [lo, tok_s, hi]},
        "by_turn": {"ttft_s": [0.1, 0.2]},
    }}, "commit": "abc", "noisy": False}


def _paired(median: float, lo: float, hi: float) -> dict:
    return {"arms": {"stock": {"ttft_p50_ms": {"median": median, "min": lo, "max": hi,
                                               "runs": [lo, median, hi]},
                               "pre_engine_ms_p50": 1.4}},
            "paired": {"ttft_ratio_p50": 0.97}}


def test_figures_finds_both_shapes_and_nothing_else() -> None:
    names = dict(figures(_chat(50.0, 1.0, 45.0, 55.0)))
    assert names == {
        "configs.suffixmem_vllm.output_tok_s": (50.0, 45.0, 55.0),
        "configs.suffixmem_vllm.hit_rate": (0.92, 0.92, 0.92),
        "configs.suffixmem_vllm.turns": (40.0, 40.0, 40.0),
        "configs.suffixmem_vllm.output_tok_vs_vllm_direct": (1.0, 0.9, 1.1),
    }
    assert dict(figures(_paired(40.0, 39.0, 42.0))) == {
        "arms.stock.ttft_p50_ms": (40.0, 39.0, 42.0)}


def test_a_rerun_inside_every_spread_survives() -> None:
    result = compare(_chat(50.0, 1.0, 45.0, 55.0), _chat(54.0, 1.08, 52.0, 60.0))
    assert result == {"figures": 4, "inside": 4, "outside": [], "missing": [],
                      "survives": True}


def test_a_median_outside_the_published_spread_is_named_with_its_move() -> None:
    result = compare(_chat(50.0, 1.0, 45.0, 55.0), _chat(62.7, 1.2, 51.5, 65.6))
    assert not result["survives"]
    assert [x["figure"] for x in result["outside"]] == [
        "configs.suffixmem_vllm.output_tok_s", "configs.suffixmem_vllm.output_tok_vs_vllm_direct"]
    first = result["outside"][0]
    assert (first["median"], first["min"], first["max"], first["rerun"]) == (50, 45, 55, 62.7)
    assert first["move"] == pytest.approx(0.254)
    # a figure whose rounds all agreed must come back exactly
    changed = _chat(50.0, 1.0, 45.0, 55.0)
    changed["configs"]["suffixmem_vllm"]["hit_rate"] = 0.91
    assert [x["figure"] for x in compare(_chat(50.0, 1.0, 45.0, 55.0), changed)["outside"]] == [
        "configs.suffixmem_vllm.hit_rate"]
    only = compare(_chat(50.0, 1.0, 45.0, 55.0), _chat(62.7, 1.2, 51.5, 65.6), only=["_vs_"])
    assert only["figures"] == 1 and len(only["outside"]) == 1


def test_a_figure_missing_from_the_rerun_fails_it() -> None:
    rerun = _paired(40.5, 39.5, 41.0)
    del rerun["arms"]["stock"]["ttft_p50_ms"]
    result = compare(_paired(40.0, 39.0, 42.0), rerun)
    assert result["missing"] == ["arms.stock.ttft_p50_ms"] and not result["survives"]


def test_cli_exits_nonzero_when_a_figure_leaves_its_spread(
        tmp_path: Path, bench_app: Any) -> None:
    from typer.testing import CliRunner

    from suffixmem_bench.compare import register

    app = bench_app(register)
    old, new, bad = tmp_path / "old.json", tmp_path / "new.json", tmp_path / "bad.json"
    old.write_text(json.dumps(_paired(40.0, 39.0, 42.0)))
    new.write_text(json.dumps(_paired(41.0, 40.0, 43.0)))
    bad.write_text(json.dumps(_paired(45.0, 44.0, 46.0)))
    runner = CliRunner()
    ok = runner.invoke(app, ["bench", "compare", str(old), str(new), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["survives"] is True
    out = runner.invoke(app, ["bench", "compare", str(old), str(bad)])
    assert out.exit_code == 1
    assert "arms.stock.ttft_p50_ms" in out.output and "does not survive" in out.output
    missing = runner.invoke(app, ["bench", "compare", str(old), str(tmp_path / "nope.json")])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_engines_and_serve_shapes_are_figures_and_a_plain_rerun_number_counts() -> None:
    engines = {"engines": {"torch": {"decode_ms": 12.6, "decode_ms_min": 12.5,
                                     "decode_ms_max": 13.1, "decode_ms_runs": [12.5, 12.6, 13.1],
                                     "prompt_tokens": 1564}}}
    serve = {"suffixmem": {"tok_s": 334.8, "spread": {"tok_s": {
        "median": 334.8, "min": 325.8, "max": 351.1, "runs": [325.8, 334.8, 351.1]}}}}
    assert dict(figures(engines)) == {"engines.torch.decode_ms": (12.6, 12.5, 13.1)}
    assert dict(figures(serve)) == {"suffixmem.tok_s": (334.8, 325.8, 351.1)}
    slower = {"engines": {"torch": {"decode_ms": 14.0, "decode_ms_min": 13.9,
                                    "decode_ms_max": 14.2}}}
    assert [x["figure"] for x in compare(engines, slower)["outside"]] == [
        "engines.torch.decode_ms"]
    # a one-round report gives its figures as plain numbers: they are read where the
    # published (pooled) report has a spread for them
    assert compare(serve, {"suffixmem": {"tok_s": 340.0}})["survives"]
    assert not compare(serve, {"suffixmem": {"tok_s": 360.0}})["survives"]
    assert compare(serve, {"suffixmem": {"tok_s": "n/a"}})["missing"] == ["suffixmem.tok_s"]


def test_exactly_checks_only_the_quoted_figures_and_plain_numbers_must_come_back_equal() -> None:
    published = _chat(50.0, 1.0, 45.0, 55.0) | {"f1": 0.54}
    rerun = _chat(62.7, 1.05, 51.5, 65.6) | {"f1": 0.54}
    result = compare(published, rerun, exactly={"configs.suffixmem_vllm.output_tok_s", "f1"})
    assert result["figures"] == 2
    assert [x["figure"] for x in result["outside"]] == ["configs.suffixmem_vllm.output_tok_s"]
    changed = compare(published, rerun | {"f1": 0.55}, exactly={"f1"})
    assert [x["figure"] for x in changed["outside"]] == ["f1"]
