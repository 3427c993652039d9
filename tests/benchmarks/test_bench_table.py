"""``suffixmem bench table``: the README's measured figures are rendered from committed reports
(median with its spread), and the README's blocks equal their rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def test_held_out_checks_each_pooled_run_on_the_quoted_figures_only() -> None:
    def run(tok_s: float, ttft: float) -> dict:
        return {"configs": {"torch": {"tok_s": tok_s, "ttft_s": ttft, "spread": {
            "tok_s": [tok_s - 1, tok_s + 1], "ttft_s": [ttft, ttft]},
            "runs": {"tok_s": [tok_s - 1, tok_s, tok_s + 1], "ttft_s": [ttft] * 3}}}}

    files = {"a.json": run(100.0, 0.03), "b.json": run(101.0, 0.04), "c.json": run(120.0, 0.05)}
    files["pooled.json"] = {"pooled_from": [{"path": p} for p in ("a.json", "b.json", "c.json")]}
    files["one.json"] = run(100.0, 0.03)
    template = ("<!-- reports\nchat: pooled.json\nsingle: one.json\n-->\n"
                "{chat.configs.torch.tok_s|tok} {single.configs.torch.tok_s|tok}")
    result = held_out_check(template, files.__getitem__)
    # the quoted throughput only (not the TTFT): c's 120 leaves a's and b's [99, 102]
    assert result["reports"]["chat"] == {"figures": 3, "inside": 2, "outside": {
        "c.json": ["configs.torch.tok_s"]}}
    assert result["unchecked"] == ["single"] and (result["figures"], result["inside"]) == (3, 2)


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
    readme.write_text("# no block\n")
    bad = runner.invoke(app, ["bench", "table", str(readme)])
    assert bad.exit_code == 2 and "no <!-- measured: TEMPLATE --> block" in bad.output
