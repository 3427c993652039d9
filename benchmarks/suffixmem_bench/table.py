"""``suffixmem bench table TEMPLATE``: the README's measured figures, read from committed reports.

Issue 10 asks that every figure in the README come from a committed ``results/`` report and
stay inside its reported spread when the command is rerun. A figure typed by hand can drift
from its report; here the README's "Measured" section is rendered from a markdown template
whose figures are placeholders into named reports, so the README and the reports cannot
disagree. Each figure shows as its median with, in brackets, where a rerun's median should
land: for a report pooled from several runs (``bench pool``), the rounds' [min–max] joined to a
99% prediction interval from how runs of this host differ (``interval``); else the rounds'
[min–max].

The template starts with an HTML comment naming its reports, one ``ALIAS: PATH`` per line
(paths relative to the repository root), and writes each figure as ``{ALIAS.PATH|FORMAT}``:
``PATH`` is the figure's name as ``bench compare`` gives it (``configs.suffixmem_torch.
output_tok_s``; a plain number at that path also works, shown without a spread) and
``FORMAT`` one of ``FORMATS``. The README holds the rendering between ``<!-- measured:
TEMPLATE -->`` and ``<!-- /measured -->``; ``--write README.md`` replaces it, ``--check
README.md`` exits 1 when it differs (the test suite runs the check), ``--held-out`` prints
issue 10's rule checked on exactly the quoted figures, each pooled run left out in turn
(``held_out_check``), and ``--rerun ALIAS=REPORT.json`` checks a fresh run of one row's command
against the brackets the README shows (``rerun_check``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from suffixmem_bench.compare import Figure, check, figures, load_report, median_at, number_at
from suffixmem_bench.interval import LEVEL, drift, widen
from suffixmem_bench.pool import pool

# FORMAT -> (scale, decimals, suffix)
FORMATS: dict[str, tuple[float, int, str]] = {
    "ms": (1000.0, 1, " ms"),    # seconds shown in milliseconds
    "ms0": (1000.0, 0, " ms"),
    "rawms": (1.0, 2, " ms"),    # already milliseconds
    "s": (1.0, 2, " s"),
    "x": (1.0, 2, "×"),          # a ratio
    "x3": (1.0, 3, "×"),
    "tok": (1.0, 1, " tok/s"),
    "pct": (100.0, 0, "%"),
    "n": (1.0, 0, ""),
    "f1": (1.0, 1, ""),
    "f2": (1.0, 2, ""),
    "f3": (1.0, 3, ""),
}
PLACEHOLDER = re.compile(r"\{(\w+)\.([\w.\-\[\]]+)\|(\w+)\}")
REPORTS = re.compile(r"\A<!-- reports\n(.*?)\n-->\n", re.S)
BLOCK = re.compile(r"(<!-- measured: (\S+) -->\n)(.*?)(<!-- /measured -->)", re.S)


def render(template: str, load: Callable[[str], Any]) -> str:
    """``template`` with its reports comment removed and every placeholder replaced by the
    figure as ``intervals`` gives it, median [lo–hi] (no brackets when lo == hi); ``load(path)``
    reads a report. A one-line ``ValueError`` names a placeholder whose alias, figure or format
    is unknown."""
    shown = intervals(template, load)
    _, body = _reports(template)
    return PLACEHOLDER.sub(lambda m: _show(shown[m[1]][m[2]], *FORMATS[m[3]]), body)


def intervals(template: str, load: Callable[[str], Any]) -> dict[str, dict[str, Figure]]:
    """Every figure ``template`` quotes, by report alias, as (median, lo, hi): for a report
    pooled from 2 runs or more, the rounds' range joined to the ``LEVEL`` prediction interval of
    a rerun (``interval``), else the rounds' range; a plain number as (n, n, n). One-line
    ``ValueError``s as ``render``'s."""
    paths, body = _reports(template)
    loaded = {alias: load(path) for alias, path in paths.items()}
    found_in = {alias: dict(figures(report)) for alias, report in loaded.items()}
    values = _run_values(template, _pooled_runs(template, paths, load))
    drifts = drift(values.values())
    out: dict[str, dict[str, Figure]] = {}
    for m in PLACEHOLDER.finditer(body):
        alias, name, fmt = m.groups()
        if alias not in loaded:
            raise ValueError(f"{m.group(0)}: no report named {alias!r} in the template")
        if fmt not in FORMATS:
            raise ValueError(f"{m.group(0)}: unknown format {fmt!r} (one of {sorted(FORMATS)})")
        found = found_in[alias].get(name)
        if found is None:
            plain = number_at(loaded[alias], name)
            if plain is None:
                raise ValueError(f"{m.group(0)}: {paths[alias]} has no figure {name}")
            found = (plain, plain, plain)
        if alias in values:
            found = widen(found, name, values[alias].get(name, []), drifts)
        out.setdefault(alias, {})[name] = found
    return out


def rerun_check(template: str, load: Callable[[str], Any], alias: str,
                rerun: Any) -> dict[str, Any]:
    """A fresh run of one row's command (``rerun``, a report) against the figures ``template``
    quotes from report ``alias``, with the brackets the README shows: ``figures``, ``inside``,
    ``outside`` (each with the quoted ``median``/``min``/``max``, the ``rerun``'s value and
    ``move``), ``missing`` and ``survives`` (``bench compare``'s shape)."""
    shown = intervals(template, load)
    if alias not in shown:
        raise ValueError(f"the template quotes no figure of a report named {alias!r} "
                         f"(one of {sorted(shown)})")
    return check(sorted(shown[alias].items()), rerun)


def quoted(template: str) -> dict[str, set[str]]:
    """The figure names ``template`` quotes, by report alias."""
    out: dict[str, set[str]] = {}
    for alias, name, _ in PLACEHOLDER.findall(template):
        out.setdefault(alias, set()).add(name)
    return out


def held_out_check(template: str, load: Callable[[str], Any],
                   level: float = LEVEL) -> dict[str, Any]:
    """Issue 10's rule on the figures ``template`` quotes, as ``render`` quotes them: for each
    report pooled from 3 runs or more (``bench pool``), each run against the pool of the others,
    its interval joined to the ``level`` prediction interval from the others' runs, the
    drift pooled over every row without the run left out. Per report: ``figures``, ``inside``,
    ``inside_range`` (inside the rounds' range alone) and ``outside`` (report -> figure
    names); at the top, their sums, ``level`` and the ``drift`` of all runs by kind. Reports
    pooled from fewer runs are listed under ``unchecked``."""
    paths, _ = _reports(template)
    pooled_runs = _pooled_runs(template, paths, load)
    values = _run_values(template, pooled_runs)
    out: dict[str, Any] = {"level": level, "drift": {
        k: {"sigma": d.sigma, "dof": d.dof} for k, d in drift(values.values()).items()},
        "reports": {}, "unchecked": []}
    for alias, names in quoted(template).items():
        if alias not in paths:
            raise ValueError(f"no report named {alias!r} in the template")
        pooled, runs, indexed = pooled_runs.get(alias, ({}, [], []))
        if len(runs) < 3:
            out["unchecked"].append(alias)
            continue
        row: dict[str, Any] = {"figures": 0, "inside": 0, "inside_range": 0, "outside": {}}
        for i, left_out in enumerate(runs):
            rest = [r for j, r in enumerate(indexed) if j != i]
            others = dict(values, **{alias: {n: _values(rest, n) for n in sorted(names)}})
            drifts = drift(others.values())
            rest_pool = _index(pool([r for r, _ in rest], [p for p in runs if p != left_out],
                                    list(pooled.get("pooled_differences", {}))))
            report, report_figures = indexed[i]
            for name in sorted(names):
                new, found = median_at(report, name, report_figures), rest_pool[1].get(name)
                if found is None:  # a plain number: one value in every run, or none
                    plain = number_at(rest_pool[0], name)
                    found = None if plain is None else (plain, plain, plain)
                if new is None or found is None:
                    continue  # missing from the run left out (compare's "missing")
                _, lo, hi = widen(found, name, others[alias][name], drifts, level)
                row["figures"] += 1
                row["inside_range"] += found[1] <= new <= found[2]
                if lo <= new <= hi:
                    row["inside"] += 1
                else:
                    row["outside"].setdefault(left_out, []).append(name)
        out["reports"][alias] = row
    for key in ("figures", "inside", "inside_range"):
        out[key] = sum(r[key] for r in out["reports"].values())
    return out


def replace_block(readme: str, rendered: Mapping[str, str]) -> str:
    """``readme`` with each ``<!-- measured: TEMPLATE -->`` block replaced by ``rendered``."""
    return BLOCK.sub(lambda m: m.group(1) + rendered[m.group(2)] + m.group(4), readme)


def templates(readme: str) -> list[str]:
    """The templates that ``readme``'s measured blocks name."""
    return [m.group(2) for m in BLOCK.finditer(readme)]


def _show(fig: tuple[float, float, float], scale: float, decimals: int, suffix: str) -> str:
    median, lo, hi = (f"{v * scale:,.{decimals}f}" for v in fig)
    if lo == hi:
        return f"{median}{suffix}"
    return f"{median}{suffix} [{lo}–{hi}]"


Indexed = tuple[Any, dict[str, Figure]]  # a report and its figures by name


def _pooled_runs(template: str, paths: Mapping[str, str], load: Callable[[str], Any]
                 ) -> dict[str, tuple[Any, list[str], list[Indexed]]]:
    """Each quoted report pooled from 2 runs or more: (the pooled report, its runs' paths, the
    runs read and indexed), so each run is read and walked once."""
    out = {}
    for alias in quoted(template):
        if alias not in paths:  # render names it in its one-line error
            continue
        pooled = _pooled(load, paths[alias])
        runs = [p.get("path") for p in pooled.get("pooled_from", [])]
        if len(runs) >= 2:
            out[alias] = (pooled, runs, [_index(load(p)) for p in runs])
    return out


def _run_values(template: str, pooled_runs: Mapping[str, tuple[Any, list[str], list[Indexed]]]
                ) -> dict[str, dict[str, list[float]]]:
    """Each quoted figure's runs' medians, for each report of ``pooled_runs``."""
    names = quoted(template)
    return {alias: {name: _values(indexed, name) for name in sorted(names[alias])}
            for alias, (_, _, indexed) in pooled_runs.items()}


def _index(report: Any) -> Indexed:
    return report, dict(figures(report))


def _values(runs: list[Indexed], name: str) -> list[float]:
    return [v for v in (median_at(report, name, found) for report, found in runs)
            if v is not None]


def _pooled(load: Callable[[str], Any], path: str) -> Any:
    try:
        return load(path)
    except OSError:  # not written yet (the held-out check's own result, on its first run)
        return {}


def _reports(template: str) -> tuple[dict[str, str], str]:
    """The template's reports (alias -> path) and the text after their comment."""
    head = REPORTS.match(template)
    if not head:
        raise ValueError("the template must start with <!-- reports ... --> naming its reports")
    paths = dict(_alias(line) for line in head.group(1).splitlines() if line.strip())
    return paths, template[head.end():]


def _alias(line: str) -> tuple[str, str]:
    alias, sep, path = line.partition(":")
    if not sep or not alias.strip().isidentifier():
        raise ValueError(f"reports line {line!r} is not 'ALIAS: PATH'")
    return alias.strip(), path.strip()


def register(bench: Any) -> None:
    """Add ``suffixmem bench table`` to the CLI's ``bench`` group."""
    import typer

    @bench.command("table")
    def table_cmd(
        readme: str = typer.Argument("README.md", help="The file with measured blocks."),
        write: bool = typer.Option(False, "--write", help="Replace the blocks in README."),
        check: bool = typer.Option(False, "--check",
                                   help="Exit 1 when a block differs from its rendering."),
        held: bool = typer.Option(
            False, "--held-out", help="JSON: each pooled run against the interval of the "
            "others, on the quoted figures only."),
        rerun: str = typer.Option(
            "", help="ALIAS=REPORT.json: a fresh run of one row's command against the "
            "README's brackets (JSON; exit 1 when a figure is outside or missing)."),
    ) -> None:
        """Render the README's measured figures from the committed reports."""
        root = Path(readme).resolve().parent

        def load(path: str) -> Any:
            return json.loads((root / path).read_text(encoding="utf-8"))

        try:
            text = Path(readme).read_text(encoding="utf-8")
            names = templates(text)
            if not names:
                raise ValueError(f"{readme} has no <!-- measured: TEMPLATE --> block")
            sources = {n: (root / n).read_text(encoding="utf-8") for n in names}
            if held:  # one template's result as is, several by template
                checks = {n: held_out_check(t, load) for n, t in sources.items()}
                print(json.dumps(checks[names[0]] if len(names) == 1 else checks, indent=2))
                return
            if rerun:
                alias, sep, path = rerun.partition("=")
                if not sep:
                    raise ValueError(f"--rerun takes ALIAS=REPORT.json, not {rerun!r}")
                result = rerun_check(sources[names[0]], load, alias, load_report(path))
                print(json.dumps(result, indent=2))
                if not result["survives"]:
                    raise typer.Exit(1)
                return
            rendered = {n: render(t, load) for n, t in sources.items()}
        except (OSError, ValueError) as e:
            raise typer.BadParameter(str(e)) from None
        new = replace_block(text, rendered)
        if write:
            Path(readme).write_text(new, encoding="utf-8")
        elif check:
            if new != text:
                print(f"{readme}'s measured figures differ from their reports; "
                      f"run `suffixmem bench table {readme} --write`")
                raise typer.Exit(1)
        else:
            print("\n".join(rendered.values()))
