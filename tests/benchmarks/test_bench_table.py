"""``suffixmem bench table``: the README's measured figures are rendered from committed reports
(median with its spread), and the README's blocks equal their rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from suffixmem_bench.interval import drift, widen
from suffixmem_bench.pool import pool
from suffixmem_bench.table import held_out_check, render, replace_block, templates

ROOT = Path(__file__).resolve().parents[2]

REPORT = {"configs": {"torch": {
    "ttft_s": 0.0285, "tok_s": 114.8, "turns": 40,
    "spread": {"ttft_s": [0.0272, 0.0289], "tok_s": [110.0, 118.8], "turns": [40, 40]}}},
    "same_engine": {"ratio": 0.966}}
TEMPLATE = """<!-- reports
chat: results/chat/x/report.json
-->
| TTFT {chat.configs.torch.ttft_s|ms} | {chat.configs.torch.tok_s|tok} | \
{chat.configs.torch.turns|n} turns | {chat.same_engine.ratio|x3} |
"""


def test_each_placeholder_becomes_its_median_and_spread() -> None:
    out = render(TEMPLATE, lambda path: REPORT)
    assert out == ("| TTFT 28.5 ms [27.2–28.9] | 114.8 tok/s [110.0–118.8] | 40 turns "
                   "| 0.966× |\n")


@pytest.mark.parametrize(("placeholder", "why"), [
    ("{other.configs.torch.tok_s|tok}", "no report named 'other'"),
    ("{chat.configs.torch.tok_s|furlongs}", "unknown format 'furlongs'"),
    ("{chat.configs.llamacpp.tok_s|tok}", "has no figure configs.llamacpp.tok_s"),
])
def test_a_bad_placeholder_is_a_one_line_error_naming_it(placeholder: str, why: str) -> None:
    template = "<!-- reports\nchat: r.json\n-->\n" + placeholder
    with pytest.raises(ValueError, match=why) as info:
        render(template, lambda path: REPORT)
    assert placeholder in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError, match="must start with <!-- reports"):
        render(placeholder, lambda path: REPORT)


def test_blocks_are_found_and_replaced_and_nothing_else_moves() -> None:
    readme = ("intro\n<!-- measured: results/t.md -->\nold | table\n<!-- /measured -->\n"
              "outro\n")
    assert templates(readme) == ["results/t.md"]
    new = replace_block(readme, {"results/t.md": "new | table\n"})
    assert new == ("intro\n<!-- measured: results/t.md -->\nnew | table\n<!-- /measured -->\n"
                   "outro\n")


def _run(tok_s: float, ttft: float) -> dict:
    return {"configs": {"torch": {"tok_s": tok_s, "ttft_s": ttft, "spread": {
        "tok_s": [tok_s - 1, tok_s + 1], "ttft_s": [ttft, ttft]},
        "runs": {"tok_s": [tok_s - 1, tok_s, tok_s + 1], "ttft_s": [ttft] * 3}}}}


def _steady(files: dict, prefix: str, runs: int, step: float, figures: int = 10) -> None:
    """A pooled row of ``figures`` throughputs that move by ``step`` from run to run: a drift
    σ that is known."""
    paths = [f"{prefix}{k}.json" for k in range(runs)]
    for k, path in enumerate(paths):
        files[path] = {"configs": {f"c{f}": {"tok_s": 100.0 * (f + 1) * (1 + step * k)}
                                   for f in range(figures)}}
    files[f"{prefix}pooled.json"] = pool([files[p] for p in paths], paths)


def test_held_out_checks_each_pooled_run_on_the_quoted_figures_only() -> None:
    files = {"a.json": _run(100.0, 0.03), "b.json": _run(101.0, 0.04), "c.json": _run(120.0, 0.05)}
    files["pooled.json"] = {"pooled_from": [{"path": p} for p in ("a.json", "b.json", "c.json")]}
    files["one.json"] = _run(100.0, 0.03)
    _steady(files, "steady", 2, step=0.005)
    quote_steady = "".join(f" {{steady.configs.c{f}.tok_s|tok}}" for f in range(10))
    template = ("<!-- reports\nchat: pooled.json\nsingle: one.json\nsteady: steadypooled.json\n"
                "-->\n{chat.configs.torch.tok_s|tok} {single.configs.torch.tok_s|tok}"
                + quote_steady)
    result = held_out_check(template, files.__getitem__)
    # the quoted throughput only (not the TTFT): c's 120 leaves a's and b's rounds [99, 102]
    # and, with σ pooled from the steady row, their prediction interval too
    assert result["reports"]["chat"] == {"figures": 3, "inside": 2, "inside_range": 2,
                                         "outside": {"c.json": ["configs.torch.tok_s"]}}
    assert result["unchecked"] == ["single", "steady"]
    assert (result["figures"], result["inside"], result["inside_range"]) == (3, 2, 2)
    assert result["level"] == 0.99 and result["drift"]["throughput"]["dof"] == 12
    # a row of its own: 2 runs give 1 degree of freedom, the interval is wide, c is inside
    alone = held_out_check(template.replace(quote_steady, ""), files.__getitem__)
    assert alone["reports"]["chat"]["inside"] == 3 and alone["inside_range"] == 2


def test_a_pooled_figure_shows_its_prediction_interval() -> None:
    files = {"a.json": _run(100.0, 0.03), "b.json": _run(104.0, 0.03)}
    files["pooled.json"] = {"pooled_from": [{"path": "a.json"}, {"path": "b.json"}],
                            "configs": {"torch": {"tok_s": 102.0, "ttft_s": 0.03, "spread": {
                                "tok_s": [99.0, 105.0], "ttft_s": [0.03, 0.03]}}}}
    _steady(files, "steady", 3, step=0.05)  # runs 5% apart: σ about 4.6%
    steady = " ".join(f"{{steady.configs.c{f}.tok_s|tok}}" for f in range(10))
    out = render("<!-- reports\nchat: pooled.json\nsteady: steadypooled.json\n-->\n"
                 "{chat.configs.torch.tok_s|tok} {chat.configs.torch.ttft_s|ms} " + steady,
                 files.__getitem__)
    rows = [{"configs.torch.tok_s": [100.0, 104.0]},
            {f"configs.c{f}.tok_s": [100.0 * (f + 1) * (1 + 0.05 * k) for k in range(3)]
             for f in range(10)}]
    _, lo, hi = widen((102.0, 99.0, 105.0), "configs.torch.tok_s", [100.0, 104.0], drift(rows))
    assert lo < 95.0 and hi > 110.0  # the other row's drift widens the rounds' [99, 105]
    # the agreeing TTFT keeps no brackets
    assert out.startswith(f"102.0 tok/s [{lo:.1f}–{hi:.1f}] 30.0 ms 1")


def test_the_readme_figures_are_their_reports_figures() -> None:
    """The README's measured blocks equal their templates rendered from the committed reports:
    a figure typed by hand, or a report replaced without `bench table --write`, fails here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    names = templates(readme)
    assert names, "README.md has no <!-- measured: TEMPLATE --> block"
    rendered = {n: render((ROOT / n).read_text(encoding="utf-8"),
                          lambda p: json.loads((ROOT / p).read_text(encoding="utf-8")))
                for n in names}
    assert replace_block(readme, rendered) == readme, (
        "README.md's measured figures differ from their reports: "
        "run `suffixmem bench table README.md --write`")


def test_cli_writes_checks_and_refuses_a_readme_without_a_block(
        tmp_path: Path, bench_app: Any) -> None:
    from typer.testing import CliRunner

    from suffixmem_bench.table import register

    app = bench_app(register)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.json").write_text(json.dumps(REPORT))
    (tmp_path / "results" / "t.md").write_text(
        "<!-- reports\nchat: results/r.json\n-->\n{chat.configs.torch.tok_s|tok}\n")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- measured: results/t.md -->\nstale\n<!-- /measured -->\n")
    runner = CliRunner()
    stale = runner.invoke(app, ["bench", "table", str(readme), "--check"])
    assert stale.exit_code == 1 and "differ from their reports" in stale.output
    assert runner.invoke(app, ["bench", "table", str(readme), "--write"]).exit_code == 0
    assert "114.8 tok/s [110.0–118.8]\n" in readme.read_text()
    assert runner.invoke(app, ["bench", "table", str(readme), "--check"]).exit_code == 0
    held = runner.invoke(app, ["bench", "table", str(readme), "--held-out"])
    assert held.exit_code == 0 and json.loads(held.stdout)["unchecked"] == ["chat"]
    fresh, slow = tmp_path / "fresh.json", tmp_path / "slow.json"
    fresh.write_text(json.dumps(REPORT))
    slow.write_text(json.dumps({"configs": {"torch": {"tok_s": 90.0}}}))
    same = runner.invoke(app, ["bench", "table", str(readme), "--rerun", f"chat={fresh}"])
    assert same.exit_code == 0 and json.loads(same.stdout)["survives"]
    out = runner.invoke(app, ["bench", "table", str(readme), "--rerun", f"chat={slow}"])
    assert out.exit_code == 1
    assert json.loads(out.stdout)["outside"] == [{
        "figure": "configs.torch.tok_s", "median": 114.8, "min": 110.0, "max": 118.8,
        "rerun": 90.0, "move": pytest.approx(90.0 / 114.8 - 1)}]
    for bad, why in ((str(slow), "--rerun takes ALIAS=REPORT.json"),
                     ("x=" + str(slow), "of a report named 'x'")):
        refused = runner.invoke(app, ["bench", "table", str(readme), "--rerun", bad])
        words = " ".join(refused.output.replace("│", " ").split())  # rich's box, wrapped
        assert refused.exit_code == 2 and why in words
    readme.write_text("# no block\n")
    bad = runner.invoke(app, ["bench", "table", str(readme)])
    assert bad.exit_code == 2 and "no <!-- measured: TEMPLATE --> block" in bad.output
